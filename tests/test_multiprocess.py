"""Several bot processes on one MongoDB database (FerretDB here): real worker
processes (tests/lease_worker.py), each a Runtime with agent leases, sharing the
scripted LLM server of this test over HTTP.

The ordering these tests hold the bot to: events of one user are processed in
the order they *joined the agent's line* (the worker reports "joined" once an
event has its ticket). The driver sends a user's next message only after the
previous one joined, to either process at random, so "sent" is a real order
across processes while the processing of each event still overlaps the next.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.durable.leases import lease_name
from memory.mongo.store import MongoStore
from memory.sqlite.coordination import CLEAR_EVERY
from tests.fake_llm import FakeLLMServer, Reply, reply_tool_calls, tool_call
from tests.mongo_server import MongoTarget, mongo_store, mongo_target

__all__ = ["mongo_store", "mongo_target"]  # the session fixture, imported to be found here

ROOT = Path(__file__).resolve().parents[1]
NUMBERED = re.compile(r"(\w+) message number (\d+)")
# Generous outer limits: on a busy machine a start or a reply can take many times
# its quiet-machine time; the tests wait on the event itself, never a fixed sleep.
START_TIMEOUT = 180.0
REPLY_TIMEOUT = 180.0


@dataclass
class Worker:
    name: str
    process: asyncio.subprocess.Process
    log: Path
    replies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _waiters: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, name: str, env: dict[str, str], folder: Path) -> Worker:
        log = folder / f"worker-{name}.log"
        with log.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.lease_worker",
                cwd=ROOT,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        worker = cls(name, process, log)
        worker._reader = asyncio.create_task(worker._read())
        await worker.wait("ready", "", within=START_TIMEOUT)
        return worker

    def _future(self, op: str, event_id: str) -> asyncio.Future[dict[str, Any]]:
        return self._waiters.setdefault((op, event_id), asyncio.get_running_loop().create_future())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)
            event_id = message.get("id", "")
            if message["op"] == "replied":
                self.replies.setdefault(event_id, []).append(message)
            future = self._future(message["op"], event_id)
            if not future.done():
                future.set_result(message)

    async def wait(self, op: str, event_id: str, within: float = REPLY_TIMEOUT) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(asyncio.shield(self._future(op, event_id)), timeout=within)
        except TimeoutError:
            raise AssertionError(
                f"worker {self.name}: no {op!r} for {event_id!r} in {within} s; log:\n"
                + self.log.read_text(errors="replace")[-3000:]
            ) from None

    async def send(self, request: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        await self.process.stdin.drain()

    async def event(self, user: str, number: int) -> str:
        event_id = f"{user}-{number}"
        await self.send({"op": "event", "id": event_id, "user": user, "text": f"{user} message number {number}"})
        return event_id

    async def stop(self) -> None:
        if self.process.returncode is None:
            try:
                await self.send({"op": "quit"})
                await self.wait("bye", "", within=REPLY_TIMEOUT)
            except (ConnectionError, AssertionError):
                self.process.kill()
        await asyncio.wait_for(self.process.wait(), timeout=REPLY_TIMEOUT)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, timeout=5)


class Model:
    """The LLM: answers every user message with send_message("reply to USER N")
    after a little simulated work, and records what each prompt showed of the
    user's history (which proves a process that was not the last to hold an
    agent reloaded it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int, list[int], float]] = []  # user, number, numbers in the prompt, when
        self.busy: list[tuple[str, float, float]] = []  # user, start, end of each call
        self.hold: dict[tuple[str, int], threading.Event] = {}  # block these until set
        self.entered: dict[tuple[str, int], threading.Event] = {}

    def __call__(self, request: dict[str, Any]) -> Reply:
        said = [str(m.get("content")) for m in request["messages"] if m["role"] == "user"]
        user, number = NUMBERED.findall(said[-1])[-1]
        shown = [int(n) for text in said for who, n in NUMBERED.findall(text) if who == user]
        with self.lock:
            self.seen.append((user, int(number), shown, time.monotonic()))
        key = (user, int(number))
        if key in self.entered:
            self.entered[key].set()
        if key in self.hold:
            self.hold[key].wait(timeout=REPLY_TIMEOUT)
        started = time.monotonic()
        threading.Event().wait(random.uniform(0.002, 0.02))  # the simulated work: lets events overlap
        with self.lock:
            self.busy.append((user, started, time.monotonic()))
        return reply_tool_calls(tool_call("send_message", {"message": f"reply to {user} {number}"}))


@pytest.fixture
def database(mongo_store: MongoStore) -> MongoStore:
    return mongo_store


def worker_env(
    mongo_target: MongoTarget, database: MongoStore, llm: FakeLLMServer, ttl: float, renew: float
) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MONGODB_URI": mongo_target.uri,
        "MONGODB_DB": database.database,
        "LLM_BASE_URL": llm.base_url,
        "MEMGPT_LEASES": "on",
        "MEMGPT_LEASE_TTL": str(ttl),
        "MEMGPT_LEASE_RENEW": str(renew),
        "MEMGPT_LEASE_WAIT": "60",
    }


async def user_numbers(store: MongoStore, user: str) -> list[int]:
    """The numbers of the user's messages as they stand in recall storage, in seq order."""
    record = await store.find_agent(f"test:{user}")
    assert record is not None, user
    messages = await store.messages_since(record.id, 0)
    return [int(n) for m in messages if m.role == "user" for who, n in NUMBERED.findall(m.content or "") if who == user]


async def line_head(store: MongoStore, key: str) -> str | None:
    """The owner of the first ticket in the agent's line not done: the lease holder's, or a
    dead one's until the next in line takes over (it then clears the dead ticket away)."""
    line = store.collection("lease_tickets")
    first = await line.find_one({"name": lease_name(key), "done": False}, sort=[("seq", 1)])
    return None if first is None else str(first["owner"])


async def test_two_processes_answer_200_events_once_each_in_order(
    mongo_target: MongoTarget, database: MongoStore, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    model = Model()
    llm_server.set_handler(model)
    # A generous ttl: nothing is killed here, and on a busy machine FerretDB (SQLite)
    # stalled for over 12 s (the 0.8 ttl of a 15 s one), which cost a worker 9 leases.
    env = worker_env(mongo_target, database, llm_server, ttl=60.0, renew=5.0)
    workers = await asyncio.gather(Worker.start("A", env, tmp_path), Worker.start("B", env, tmp_path))
    users, per_user = [f"u{n:02d}" for n in range(20)], 10
    rng = random.Random(20)
    routes: dict[str, list[int]] = {}
    for user in users:
        route = [rng.randrange(2) for _ in range(per_user)]
        route[rng.randrange(per_user)] ^= 1 if len(set(route)) == 1 else 0  # both processes get some
        routes[user] = route
    try:

        async def session(user: str) -> None:
            for number, which in enumerate(routes[user], 1):
                event_id = await workers[which].event(user, number)
                await workers[which].wait("joined", event_id)  # its place in line is taken: now send the next

        await asyncio.gather(*(session(user) for user in users))
        for user in users:
            for number, which in enumerate(routes[user], 1):
                await workers[which].wait("replied", f"{user}-{number}")
    finally:
        await asyncio.gather(*(worker.stop() for worker in workers))

    # Every event answered exactly once, by the process it was sent to.
    answered = Counter(event_id for worker in workers for event_id, replies in worker.replies.items() for _ in replies)
    assert set(answered) == {f"{u}-{n}" for u in users for n in range(1, per_user + 1)}
    assert set(answered.values()) == {1}
    for which, worker in enumerate(workers):
        for event_id, [reply] in worker.replies.items():
            user, number = event_id.split("-")
            assert routes[user][int(number) - 1] == which
            assert reply["error"] is None and reply["texts"] == [f"reply to {user} {number}"], reply
    assert all(len(worker.replies) > 50 for worker in workers)
    # Never two processes at work on one agent: each user's model calls never overlap.
    for user in users:
        calls = sorted((start, end) for who, start, end in model.busy if who == user)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(calls)), user
    # One LLM call per event (nothing processed twice), and every prompt showed
    # the user's whole history so far, in order: each process reloaded an agent
    # the other one had worked on.
    assert len(model.seen) == len(users) * per_user
    for user, number, shown, _ in model.seen:
        assert shown == list(range(1, number + 1)), (user, number, shown)
    # Recall storage: every message exactly once, in the order sent.
    for user in users:
        assert await user_numbers(database, user) == list(range(1, per_user + 1)), user
    # Finished tickets were cleared away as the lines moved.
    assert await database.collection("lease_tickets").count_documents({}) <= len(users) * CLEAR_EVERY


async def test_a_killed_holder_is_taken_over_after_the_lease_expires(
    mongo_target: MongoTarget, database: MongoStore, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    ttl = 2.0
    model = Model()
    model.hold[("victim", 3)] = release = threading.Event()
    model.entered[("victim", 3)] = entered = threading.Event()
    llm_server.set_handler(model)
    env = worker_env(mongo_target, database, llm_server, ttl=ttl, renew=0.4)
    a, b = await asyncio.gather(Worker.start("A", env, tmp_path), Worker.start("B", env, tmp_path))
    try:
        # Acknowledged before the crash: 1 by B (which caches the agent), 2 by A.
        for worker, number in ((b, 1), (a, 2)):
            reply = await worker.wait("replied", await worker.event("victim", number))
            assert reply["texts"] == [f"reply to victim {number}"]
        # 3 hangs in A's LLM call, A holding the lease; 4 reaches B and waits in line.
        await a.wait("joined", await a.event("victim", 3))
        assert await asyncio.to_thread(entered.wait, REPLY_TIMEOUT)
        await b.wait("joined", await b.event("victim", 4))
        holder_before = await line_head(database, "test:victim")
        a.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.wait_for(a.process.wait(), timeout=10)
        # The lease changes hands when B's ticket gets its turn (B clears A's dead ticket away).
        deadline = killed + ttl + REPLY_TIMEOUT
        while (holder := await line_head(database, "test:victim")) == holder_before:
            assert time.monotonic() < deadline, "B never took the lease over"
            await asyncio.sleep(0.02)
        took_over = time.monotonic()
        reply = await b.wait("replied", "victim-4")
        assert reply["error"] is None and reply["texts"] == ["reply to victim 4"]
        reply = await b.wait("replied", await b.event("victim", 5))
        assert reply["texts"] == ["reply to victim 5"]
    finally:
        release.set()
        await asyncio.gather(a.stop(), b.stop())

    calls = {(user, number): (shown, at) for user, number, shown, at in model.seen}
    assert set(calls) == {("victim", n) for n in range(1, 6)}  # 3 was never retried, nothing ran twice
    # A held the lease up to the kill; B waited for A's heartbeat to expire (it was
    # renewed every 0.4 s, so it lived at least 0.8 ttl minus that after the kill)
    # before it took the lease over. (How soon after is the machine's business.)
    assert holder_before is not None and f":{a.process.pid}:" in holder_before
    assert holder is not None and f":{b.process.pid}:" in holder
    assert took_over > killed + ttl / 2, took_over - killed
    # B reloaded the agent: its prompt shows 2 (A's) and 3 (recorded by A before it died).
    assert calls[("victim", 4)][0] == [1, 2, 3, 4]
    assert calls[("victim", 5)][0] == [1, 2, 3, 4, 5]
    assert "victim-3" not in a.replies
    assert await user_numbers(database, "victim") == [1, 2, 3, 4, 5]  # nothing acknowledged was lost


async def test_a_database_stall_of_several_seconds_costs_no_lease_and_no_event(
    mongo_target: MongoTarget, database: MongoStore, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    """FerretDB is frozen (SIGSTOP) for 6 s while two processes have events in
    hand: the heartbeats (ttl 15 s, renewed every 2 s; a renewal without an
    answer is sent again) outlive it, and every event is answered once."""
    if mongo_target.server is None or mongo_target.server.process is None:
        pytest.skip("needs the tests' own FerretDB process to freeze")
    server = mongo_target.server.process
    model = Model()
    llm_server.set_handler(model)
    env = worker_env(mongo_target, database, llm_server, ttl=15.0, renew=2.0)
    workers = await asyncio.gather(Worker.start("A", env, tmp_path), Worker.start("B", env, tmp_path))
    users, per_user = [f"s{n}" for n in range(4)], 4
    under_way = asyncio.Event()
    try:

        async def session(user: str) -> None:
            for number in range(1, per_user + 1):
                worker = workers[number % 2]
                await worker.wait("replied", await worker.event(user, number))
                under_way.set()

        sessions = asyncio.gather(*(session(user) for user in users))
        await asyncio.wait_for(under_way.wait(), timeout=REPLY_TIMEOUT)  # the first answer is out
        server.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(6.0)  # the stall itself, not a wait for something
        finally:
            server.send_signal(signal.SIGCONT)
        await sessions
    finally:
        server.send_signal(signal.SIGCONT)
        await asyncio.gather(*(worker.stop() for worker in workers))
    for worker in workers:
        log = worker.log.read_text(errors="replace")
        assert "ran out" not in log, log[-2000:]
        for event_id, [reply] in worker.replies.items():
            assert reply["error"] is None, (event_id, reply)
    answered = Counter(event_id for worker in workers for event_id in worker.replies)
    assert answered == Counter({f"{u}-{n}": 1 for u in users for n in range(1, per_user + 1)})
    for user in users:
        assert await user_numbers(database, user) == list(range(1, per_user + 1)), user
