"""Store faults (bot/door.py: StoreWait, bot/durable/): SQLite busy/locked, a full
disk, MongoDB unreachable. Events wait (bounded) and resume, nothing
acknowledged is lost or answered twice, and the person is told when the bot
cannot keep up.

Each fault class is injected N_ROUNDS times in each of four shapes, through
the real Slack adapter (fake Slack Web API) and a real Runtime on a real store:

- short: the fault starts during the event (while the model thinks, so the
  message is already recorded) and heals once the event has met it (its
  "trouble saving" notice went out), within MEMGPT_STORE_WAIT: answered once,
  after that one notice;
- long: the fault outlasts MEMGPT_STORE_WAIT: the person is told clearly, the
  event stays pending in the inbox and, once the fault heals, the retrier
  replays it in process: answered once;
- arrival: the fault is there when Slack delivers: the event cannot be
  recorded in the inbox, so the HTTP ack is not 2xx (Slack delivers again); the
  redelivery, once the fault healed and the store reaches its data again, is
  answered once;
- direct: a non-durable event (the terminal's way) arrives during the fault,
  waits (the fault heals once its notice went out), and is answered once.

The harness waits for events, never for a time: a fault heals when the event
has met it, not after a fixed delay a busy machine may outrun (the model's
answer can take longer than the fault would have lasted, and the event then
never sees it).

A fault *survives* when its event is answered exactly once, its message is in
recall storage exactly once, at most one notice went out, no apology (an
exception escaping) was posted, and its inbox entry ends done. The figures
are printed per class.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import pytest

from adapters.slack import APOLOGY
from bot.door import KEPT_MESSAGE, LOST_MESSAGE, TROUBLE_NOTICE
from bot.durable.leases import AgentLeases, NoLeases
from bot.durable.redelivery import Redelivery
from bot.events import Reply as BotReply
from bot.events import UserMessage
from bot.llm import LLMClient
from bot.runtime import Runtime
from bot.settings import LeaseSettings
from memory.embeddings import Embedder
from memory.mongo.store import MongoStore
from memory.sqlite.store import SQLiteStore
from memory.store import OutboxEntry, Store, StoreError
from memory.types import Message, utc_now
from tests.conftest import make_settings
from tests.fake_llm import FakeLLMServer, Reply, say
from tests.helpers import free_port
from tests.mongo_server import MongoTarget, ScratchMongoStore, mongo_target
from tests.test_slack_adapter import SlackBot, Start, dm, fake_slack, start_bot

__all__ = ["fake_slack", "mongo_target", "start_bot"]  # fixtures, imported to be found here

N_ROUNDS = 3  # per fault class; each round injects the fault four times (the shapes above)
# MEMGPT_STORE_WAIT for the fault classes, seconds. The first failed attempt
# must come within it (else the event gives up at once, without the notice):
# the model's first answer, then a server selection timeout or two (MongoDB,
# 0.5 s each) took up to 2 s on a busy 2-core machine (load 8).
STORE_WAIT = 4.0
QUICK_WAIT = 1.5  # for the smaller promises, where nothing needs the store in between
KEY = "slack:T1:U1"
CHANNEL = "DU1"
TALLY: dict[str, tuple[int, int]] = {}  # fault class -> (injected, survived)


class Fault(Protocol):
    """A store fault that can be switched on and off from any thread."""

    def inject(self) -> None: ...

    def heal(self) -> None: ...


# --------------------------------------------------------------------------- the faults


class BusyLock:
    """Another connection holds the SQLite write lock (BEGIN EXCLUSIVE; in WAL
    mode readers go on) for longer than the store's busy_timeout."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5)
        self._guard = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"BusyLock({'held' if self._conn.in_transaction else 'free'})"

    def inject(self) -> None:
        with self._guard:
            self._conn.execute("BEGIN EXCLUSIVE")

    def heal(self) -> None:
        with self._guard:
            if not self._closed and self._conn.in_transaction:
                self._conn.execute("COMMIT")

    def close(self) -> None:
        self.heal()
        with self._guard:
            self._closed = True
            self._conn.close()


class DiskFull:
    """The data directory (a small tmpfs) filled up by another file. The WAL
    is checkpointed and truncated first, so the next commit has to grow it
    (a WAL with room left would take a few more small writes)."""

    def __init__(self, folder: Path, db: Path) -> None:
        self.filler = folder / "filler"
        self.db = db

    def __repr__(self) -> str:
        return f"DiskFull({'full' if self.filler.exists() else 'room'})"

    def inject(self) -> None:
        conn = sqlite3.connect(self.db, timeout=5)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
                with contextlib.suppress(OSError):  # ENOSPC: on with smaller pieces
                    while True:
                        os.write(fd, b"\0" * size)
        finally:
            os.close(fd)

    def heal(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()


class MongoProxy:
    """A TCP proxy in front of the MongoDB server. `inject` stops listening
    (connections are refused) and cuts every open connection; `heal` listens
    again on the same port."""

    def __init__(self, upstream: tuple[str, int], loop: asyncio.AbstractEventLoop) -> None:
        self.upstream = upstream
        self.loop = loop
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._switching: set[asyncio.Future[None]] = set()

    def __repr__(self) -> str:
        state = "listening" if self._server is not None else "cut"
        return f"MongoProxy({state}, {len(self._writers) // 2} connections, {len(self._switching)} switches under way)"

    @property
    def uri(self) -> str:
        # The client looks for a lost server every 0.5 s (not the default 10 s):
        # found again soon after the proxy listens again.
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true&heartbeatFrequencyMS=500"

    async def listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port, reuse_address=True)

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()

    def inject(self) -> None:
        self._run(self.cut())

    def heal(self) -> None:
        self._run(self.listen())

    def _run(self, work: Awaitable[None]) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:  # on the loop: schedule it (callers there do not wait)
            switch = asyncio.ensure_future(work)
            self._switching.add(switch)
            switch.add_done_callback(self._switching.discard)
        else:
            asyncio.run_coroutine_threadsafe(work, self.loop).result(10)  # type: ignore[arg-type]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
        self._writers -= {writer, up_writer}


def finds_its_server(store: MongoStore) -> bool:
    """Whether the store's client sees its server again: until it does, each
    operation fails after the server selection timeout, though the server is up."""
    client = store._client
    return client is not None and client.topology_description.has_writable_server()


# --------------------------------------------------------------------------- the harness


def number_in(request: dict[str, Any]) -> str:
    """The N of the last "number N" the person wrote, as the model sees it."""
    for message in reversed(request["messages"]):
        if message["role"] == "user":
            found = re.findall(r"number (\d+)", str(message["content"]))
            if found:
                return found[-1]
    return "?"


@dataclass
class Rig:
    """One fault class: the runtime, Slack around it, the model, the fault."""

    name: str
    runtime: Runtime
    bot: SlackBot
    llm: FakeLLMServer
    fault: Fault
    witness: Store  # another connection to the same data: reads while the fault is on (where reads work)
    direct: list[BotReply] = field(default_factory=list)  # notices for non-Slack users
    # "number N" -> what to do at the model's first call for it (inject a fault)
    hooks: dict[str, Callable[[], None]] = field(default_factory=dict)
    numbers: Iterator[int] = field(default_factory=lambda: iter(range(1, 10_000)))
    injected: int = 0
    survived: int = 0
    through_slack: list[int] = field(default_factory=list)  # numbers sent as Slack events
    retrier: Redelivery | None = None
    current: tuple[str, int, str, int] = ("none", 0, "", 0)  # shape, number, event id, channel length before
    heal_on_notice: bool = False  # heal the fault once a "trouble saving" notice went out
    # Whether the store reaches its data again after a heal (a MongoDB client
    # has to find the server again first: an event before that is refused again).
    reachable: Callable[[], bool] = lambda: True

    def model(self, request: dict[str, Any]) -> Reply:
        number = number_in(request)
        hook = self.hooks.pop(number, None)
        if hook is not None:
            hook()
        return say(f"answer {number}")

    async def notify(self, replies: list[BotReply]) -> None:
        # What cli/app.py wires: Slack replies to the adapter, the others noted here.
        slack = [reply for reply in replies if reply.platform == "slack"]
        self.direct += [reply for reply in replies if reply.platform != "slack"]
        if slack:
            await self.bot.adapter.deliver(slack)
        if self.heal_on_notice and TROUBLE_NOTICE in [reply.text for reply in replies]:
            self.heal_on_notice = False  # the event met the fault: it may go through now
            await self.heal()
            # The event tries again once this returns: when the store reaches its data.
            await self.wait_for("the store to reach its data again", self.reachable)

    def texts(self) -> list[str]:
        return [str(message["text"]) for message in self.bot.slack.messages_in(CHANNEL)]

    async def inject(self) -> None:
        """Inject the fault; done when this returns (the proxy is cut, the lock held)."""
        await asyncio.to_thread(self.fault.inject)

    async def heal(self) -> None:
        """Heal the fault; done when this returns (the proxy listens again)."""
        await asyncio.to_thread(self.fault.heal)

    async def stored(self, key: str, number: int) -> int:
        record = await self.witness.find_agent(key)
        assert record is not None
        messages = await self.witness.messages_since(record.id, 0)
        return sum(1 for m in messages if m.role == "user" and f"number {number}" in m.content)

    async def wait_for(self, what: str, condition: Callable[[], bool], within: float = 10.0) -> None:
        """Wait until `condition()` holds; on timeout fail with what was awaited
        and the state of the event being awaited (`self.current`)."""

        async def check() -> bool:
            return condition()

        if not await until(check, within):
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}\n{await self.diagnosis()}")

    async def diagnosis(self) -> str:
        """The state of the current event: its inbox row, its outbox rows,
        what the channel got, the fault; read through the witness."""
        shape, number, event_id, before = self.current
        lines = [f"{self.name}: {shape} number {number} (event {event_id}); fault: {self.fault!r}"]
        try:
            inbox = await self.witness.inbox_pending("slack")
            lines.append(f"inbox, unfinished: {[(e.event_id, e.state, e.attempts, e.next_try_at) for e in inbox]}")
            if event_id:
                outbox = await self.witness.outbox_for_event(event_id)
                lines.append(f"outbox of {event_id}: {[(e.id, e.state, e.attempts, e.text) for e in outbox]}")
            pending = await self.witness.outbox_pending("slack")
            lines.append(f"outbox, unconfirmed: {[(e.id, e.state, e.attempts, e.text) for e in pending]}")
        except StoreError as error:
            lines.append(f"(the witness cannot read the store: {error})")
        lines.append(f"channel got since the event: {self.texts()[before:]}")
        return "\n".join(lines)

    async def settled(self, event_id: str) -> bool:
        await self.bot.adapter.drain()
        return event_id not in [entry.event_id for entry in await self.witness.inbox_pending("slack")]

    async def check(self, number: int, event_id: str, new: list[str], *, notices: int, told: int) -> bool:
        """Whether the event of `number` survived: answered once, stored once,
        finished, no apology; and the person was told what the shape calls
        for (`new`: what the channel got since the event was sent)."""
        done = await until(lambda: self.settled(event_id))  # first: a second answer would be out by then
        answered = self.texts().count(f"answer {number}")
        stored = await self.stored(KEY, number)
        told_right = new.count(TROUBLE_NOTICE) == notices and new.count(KEPT_MESSAGE) == told
        self.through_slack.append(number)
        ok = answered == 1 and stored == 1 and APOLOGY not in new and done and told_right
        if not ok:
            print(f"answered {answered}x, stored {stored}x, done {done}\n{await self.diagnosis()}")
        return ok

    def tally(self, survived: bool) -> None:
        self.injected += 1
        self.survived += survived

    # -- the four shapes -------------------------------------------------------
    async def short_fault(self) -> None:
        """Starts while the model thinks, heals once the event met it (within MEMGPT_STORE_WAIT)."""
        n, before = next(self.numbers), len(self.texts())
        event_id = f"EvS{self.name}{n}"
        self.current = ("short", n, event_id, before)

        def inject() -> None:  # in the model's thread
            self.heal_on_notice = True
            self.fault.inject()

        self.hooks[str(n)] = inject
        assert await self.bot.event(dm(f"number {n}"), event_id=event_id) == 200
        await self.wait_for(f"answer {n}", lambda: f"answer {n}" in self.texts())
        self.tally(await self.check(n, event_id, self.texts()[before:], notices=1, told=0))

    async def long_fault(self) -> None:
        """Outlasts MEMGPT_STORE_WAIT: told, kept pending, replayed after it heals."""
        n, before = next(self.numbers), len(self.texts())
        event_id = f"EvL{self.name}{n}"
        self.current = ("long", n, event_id, before)
        self.hooks[str(n)] = self.fault.inject
        assert await self.bot.event(dm(f"number {n}"), event_id=event_id) == 200
        await self.wait_for("the kept-message notice", lambda: KEPT_MESSAGE in self.texts()[before:], STORE_WAIT + 10)
        # Given up, and kept: still pending in the inbox (seen through another
        # connection), and it cannot be replayed before the fault heals.
        pending = [entry.event_id for entry in await self.witness.inbox_pending("slack")]
        await self.heal()
        await self.wait_for(f"answer {n}, replayed by the retrier", lambda: f"answer {n}" in self.texts())
        kept = event_id in pending
        self.tally(await self.check(n, event_id, self.texts()[before:], notices=1, told=1) and kept)

    async def at_arrival(self) -> None:
        """There before the event: not recorded in the inbox, not acked; the redelivery is answered."""
        n, before = next(self.numbers), len(self.texts())
        event_id = f"EvA{self.name}{n}"
        self.current = ("arrival", n, event_id, before)
        await self.inject()
        try:
            refused = await self.bot.event(dm(f"number {n}"), event_id=event_id)
        finally:
            await self.heal()
        # Slack delivers again a minute later; by then the store reaches its data.
        await self.wait_for("the store to reach its data again", self.reachable)
        redelivered = await self.bot.event(dm(f"number {n}"), event_id=event_id)
        await self.wait_for(
            f"answer {n} (the redelivery was acked {redelivered})", lambda: f"answer {n}" in self.texts()
        )
        not_acked = not 200 <= refused < 300 and redelivered == 200
        self.tally(await self.check(n, event_id, self.texts()[before:], notices=0, told=0) and not_acked)

    async def direct_event(self) -> None:
        """A non-durable event arrives during the fault, waits, is answered."""
        n = next(self.numbers)
        self.current = ("direct", n, "", len(self.texts()))
        await self.inject()
        self.heal_on_notice = True
        event = UserMessage(platform="terminal", user_id="direct", text=f"number {n}")
        try:
            replies = [reply.text for reply in await self.runtime.handle(event)]
        finally:
            if self.heal_on_notice:  # no notice came: the fault must not outlive the shape
                self.heal_on_notice = False
                await self.heal()
        stored = await self.stored("terminal:direct", n)
        notices = [reply.text for reply in self.direct].count(TROUBLE_NOTICE)
        self.direct.clear()
        ok = replies == [f"answer {n}"] and stored == 1 and notices == 1
        if not ok:
            print(f"replies {replies}, stored {stored}x, notices {notices}\n{await self.diagnosis()}")
        self.tally(ok)

    async def run_rounds(self, rounds: int = N_ROUNDS) -> None:
        for _ in range(rounds):
            await self.short_fault()
            await self.long_fault()
            await self.at_arrival()
            await self.direct_event()
        # Late duplicates (a replay or a resend after the check) would show now.
        await asyncio.sleep(0.5)
        await self.bot.adapter.drain()
        texts = self.texts()
        self.survived -= sum(1 for n in self.through_slack if texts.count(f"answer {n}") != 1)
        assert await self.witness.inbox_pending("slack") == []
        TALLY[self.name] = (self.injected, self.survived)
        report = (
            f"store faults, {self.name}: {self.injected} injected, {self.survived} survived "
            "(answered once, stored once, nothing left pending)"
        )
        print("\n" + report)
        assert self.survived == self.injected, report


async def until(condition: Callable[[], Awaitable[bool]], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def open_patiently(store: Store, within: float = 60.0) -> None:
    """Open a store that is up but may be slow to answer its first call. The MongoDB
    tests give their store a short server selection timeout (an attempt while the
    database is down fails fast), and with two CPU hogs beside the suite the healthy
    server's first reply once came after it: 'unreachable' before any fault."""
    deadline = time.monotonic() + within
    while True:
        try:
            await store.open()
            return
        except StoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.fixture
def rig_parts(llm_server: FakeLLMServer, embedder: Embedder) -> Iterator[Callable[..., Awaitable[Runtime]]]:
    """Build a Runtime on a given store: MEMGPT_STORE_WAIT short, fast redo backoff."""
    created: list[Runtime] = []

    async def build(store: Store, data_dir: Path, leases: Any = None, wait: float = STORE_WAIT) -> Runtime:
        settings = make_settings(data_dir, store_wait=wait)
        llm = LLMClient(
            settings.model,
            api_key=settings.openai_api_key,
            base_url=llm_server.base_url,
            timeout=settings.llm_timeout,
            max_retries=settings.llm_max_retries,
        )
        await open_patiently(store)
        runtime = Runtime(settings, store, llm, embedder, leases=leases or NoLeases())
        runtime.store_wait.first_delay, runtime.store_wait.max_delay = 0.1, 0.4
        runtime.inbox.replay_after = 0.3  # deferred events replayed soon after they gave up
        created.append(runtime)
        return runtime

    yield build
    # Closed by `rig` (below) so that every close happens on the test's loop.


@pytest.fixture
async def rig(
    rig_parts: Callable[..., Awaitable[Runtime]], start_bot: Start, llm_server: FakeLLMServer
) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    rigs: list[Rig] = []

    async def make(name: str, store: Store, witness: Store, fault: Fault, data_dir: Path, leases: Any = None) -> Rig:
        runtime = await rig_parts(store, data_dir, leases)
        await witness.open()
        bot = await start_bot(runtime)
        built = Rig(name, runtime, bot, llm_server, fault, witness)
        llm_server.set_handler(built.model)
        runtime.store_wait.notify = built.notify
        # As `memgpt-bot run` does: the start-up replay, then the retrier (which replays deferred events).
        assert await bot.adapter.recover() == 0
        built.retrier = Redelivery(
            runtime.inbox,
            runtime.outbox,
            {"slack": bot.adapter.deliver},
            poll=0.1,
            replayers={"slack": bot.adapter.replay},
        )
        built.retrier.start()
        rigs.append(built)
        return built

    yield make
    for built in rigs:
        built.fault.heal()
        assert built.retrier is not None
        await built.retrier.stop()
        await built.bot.adapter.close(grace=5)
        await built.runtime.close(close_embedder=False)
        await built.witness.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 8 MB tmpfs: a disk that can be filled in a moment."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small disk to fill")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


# --------------------------------------------------------------------------- the fault classes


async def test_sqlite_busy_or_locked(rig: Callable[..., Awaitable[Rig]], tmp_path: Path) -> None:
    path = tmp_path / "data" / "memgpt.sqlite3"
    store = SQLiteStore(path, busy_timeout=0.2)  # shorter than the lock is held
    await store.open()  # the file must exist for the locking connection
    lock = BusyLock(path)
    try:
        built = await rig("busy/locked", store, SQLiteStore(path), lock, tmp_path / "data")
        await built.run_rounds()
    finally:
        lock.close()


async def test_sqlite_disk_full(rig: Callable[..., Awaitable[Rig]], small_disk: Path) -> None:
    path = small_disk / "memgpt.sqlite3"
    store = SQLiteStore(path)
    await store.open()
    built = await rig("disk full", store, SQLiteStore(path), DiskFull(small_disk, path), small_disk)
    await built.run_rounds()
    # A full disk can also fail a WAL checkpoint: the store still writes once there is room again.
    built.fault.inject()
    with pytest.raises(StoreError, match="disk is full"):
        await store.record_usage("probe", {"probe": 1}, utc_now())
    built.fault.heal()
    await store.record_usage("probe", {"probe": 1}, utc_now())
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy: it went through
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


# "on" once hung for good: a heartbeat cancelled inside a PyMongo call broke the
# client's lock (bot/durable/leases.py now stops it between renewals instead).
@pytest.mark.parametrize("leases", ["off", "on"])
async def test_mongodb_unreachable_and_back(
    rig: Callable[..., Awaitable[Rig]], mongo_target: MongoTarget, tmp_path: Path, leases: str
) -> None:
    parts = urlsplit(mongo_target.uri)
    if parts.hostname is None or "," in parts.netloc:
        pytest.skip("the proxy needs a single-host MongoDB target")
    proxy = MongoProxy((parts.hostname, parts.port or 27017), asyncio.get_running_loop())
    await proxy.listen()
    database = mongo_target.database_name()
    # A short server selection timeout: each attempt while MongoDB is down fails fast.
    store = MongoStore(proxy.uri, database, server_selection_timeout=0.5)
    witness = ScratchMongoStore(mongo_target.uri, database, server_selection_timeout=5.0)  # not through the proxy
    # Leases are on with MongoDB in production; a short ttl, so that a ticket
    # left by an attempt cut off mid-way holds the agent's line for 3 s at most.
    agent_leases = AgentLeases(store, LeaseSettings(mode="on", ttl=3.0, renew_every=1.0)) if leases == "on" else None
    try:
        built = await rig(
            "MongoDB down" + (" (leases on)" if agent_leases else ""),
            store,
            witness,
            proxy,
            tmp_path,
            leases=agent_leases,
        )
        built.reachable = lambda: finds_its_server(store)
        await built.run_rounds()
    finally:
        await proxy.listen()


# --------------------------------------------------------------------------- smaller promises


async def test_an_event_waits_at_most_store_wait_and_a_plain_one_is_asked_again(
    rig_parts: Callable[..., Awaitable[Runtime]], tmp_path: Path
) -> None:
    path = tmp_path / "data" / "memgpt.sqlite3"
    store = SQLiteStore(path, busy_timeout=0.1)
    runtime = await rig_parts(store, tmp_path / "data", wait=QUICK_WAIT)
    lock = BusyLock(path)
    notices: list[BotReply] = []

    async def notify(replies: list[BotReply]) -> None:
        notices.extend(replies)

    runtime.store_wait.notify = notify
    try:
        lock.inject()
        started = time.monotonic()
        for text in ("hello?", "anyone?"):
            result = await runtime.handle_with_details(UserMessage(platform="terminal", user_id="t", text=text))
            # Nothing was kept, so the person is asked to send it again (each time).
            assert result.unfinished and [reply.text for reply in result.replies] == [LOST_MESSAGE]
        took = time.monotonic() - started
        assert took < 2 * (QUICK_WAIT + 0.5), took
        assert [reply.text for reply in notices] == [TROUBLE_NOTICE]  # one notice for the outage
    finally:
        lock.close()
        await runtime.close(close_embedder=False)


async def test_the_notice_and_message_are_once_per_outage(
    rig_parts: Callable[..., Awaitable[Runtime]], tmp_path: Path, llm_server: FakeLLMServer
) -> None:
    """A durable event that gives up is kept and not finished; a second one of
    the same person during the same outage gets no second message."""
    path = tmp_path / "data" / "memgpt.sqlite3"
    store = SQLiteStore(path, busy_timeout=0.1)
    runtime = await rig_parts(store, tmp_path / "data")
    runtime.store_wait.wait = 0.3
    # Not due by its time during this test however slow the machine (0.3 s was
    # a race with the writes below); the test is about storage answering.
    runtime.inbox.replay_after = 60.0
    llm_server.set_handler(lambda request: say("hi"))
    lock = BusyLock(path)
    try:
        assert await runtime.leftovers("slack") == []  # the start-up replay: nothing left over
        for event_id in ("E1", "E2"):
            await runtime.receive("slack", event_id, "T1:U1", {"kind": "message"})
        lock.inject()
        first, second = [
            await runtime.handle_with_details(
                UserMessage(platform="slack", user_id="T1:U1", text=text, event_id=event_id, in_inbox=True)
            )
            for text, event_id in (("one", "E1"), ("two", "E2"))
        ]
        assert [reply.text for reply in first.replies] == [KEPT_MESSAGE] and second.replies == []
        assert first.unfinished and second.unfinished and second.trouble == KEPT_MESSAGE
        await runtime.finished("E1")
        await runtime.finished("E2")
        lock.heal()
        assert [e.event_id for e in await store.inbox_pending("slack")] == ["E1", "E2"]  # kept
        assert await runtime.inbox.due("slack") == []  # due replay_after after giving up...
        assert {e.state for e in await store.inbox_pending("slack")} == {"waiting"}  # in the rows now
        result = await runtime.handle_with_details(UserMessage(platform="terminal", user_id="x", text="ok"))
        assert not result.unfinished
        # ...or at once, now that storage answered
        assert [redo.payload for redo in await runtime.inbox.due("slack")] == [{"kind": "message"}] * 2
        assert await runtime.inbox.due("slack") == []
    finally:
        lock.close()
        await runtime.close(close_embedder=False)


class OutboxWriteFailsOnce(SQLiteStore):
    """A SQLite store whose next outbox write fails once: what a write to a
    MongoDB whose connection was just cut does (the one after reconnects).
    A reply's outbox entry is written with its step's record (append_messages'
    `replies`), or alone (outbox_add) at the end of an event."""

    fail_next_outbox_add = False

    def _fail_once(self) -> None:
        if self.fail_next_outbox_add:
            self.fail_next_outbox_add = False
            raise StoreError("storage unreachable for a moment")

    async def outbox_add(self, entry: OutboxEntry) -> bool:
        self._fail_once()
        return await super().outbox_add(entry)

    async def append_messages(
        self,
        agent_id: str,
        messages: Sequence[Message],
        *,
        unless_event: str | None = None,
        replies: Sequence[OutboxEntry] = (),
        after: int | None = None,
    ) -> list[Message]:
        if replies:
            self._fail_once()
        return await super().append_messages(
            agent_id, messages, unless_event=unless_event, replies=replies, after=after
        )


async def test_a_store_fault_inside_a_function_redoes_the_event_and_never_reaches_the_model(
    rig_parts: Callable[..., Awaitable[Runtime]], tmp_path: Path, llm_server: FakeLLMServer
) -> None:
    """send_message's outbox write fails: the event waits and is redone whole,
    with one notice. (It once became a failed call the model was shown, with
    the store's error text, and the event went on without the person told;
    tests/test_store_faults.py's MongoDB short faults found it.)"""
    store = OutboxWriteFailsOnce(tmp_path / "data" / "memgpt.sqlite3")
    runtime = await rig_parts(store, tmp_path / "data")
    notices: list[BotReply] = []

    async def notify(replies: list[BotReply]) -> None:
        notices.extend(replies)

    calls: list[dict[str, Any]] = []

    def model(request: dict[str, Any]) -> Reply:
        calls.append(request)
        if len(calls) == 1:  # the model's first call: the message is recorded by now
            store.fail_next_outbox_add = True
        return say("answer")

    runtime.store_wait.notify = notify
    llm_server.set_handler(model)
    try:
        await runtime.receive("slack", "E1", "T1:U1", {"kind": "message"})
        event = UserMessage(platform="slack", user_id="T1:U1", text="hello", event_id="E1", in_inbox=True)
        result = await runtime.handle_with_details(event)
    finally:
        await runtime.close(close_embedder=False)
    assert [reply.text for reply in result.replies] == ["answer"] and not result.unfinished
    assert [reply.text for reply in notices] == [TROUBLE_NOTICE]
    seen_by_model = json.dumps(calls)
    assert "StoreError" not in seen_by_model and "unreachable" not in seen_by_model
