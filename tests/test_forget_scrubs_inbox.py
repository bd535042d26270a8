"""Forget reaches the inbox and the outbox: no copy of the words is left.

A person chats as an adapter makes them chat: each event is recorded in the
inbox (its platform payload), handled, its replies reported sent through the
outbox, and finished. Then they forget (everything, a topic through the CLI or
through the runtime, one item), and, as a person copying the data folder right
after would, the storage is scanned: on SQLite every table of a copy of the
folder and the raw bytes of its database file, -wal and -shm; on MongoDB every
document of every collection. The same scan before the forget must find the
words in the inbox and the outbox (so a blind scan cannot pass), a second
person's words survive, and the inbox still knows every finished event's id
(a repeat delivery is dropped, as for a day after any event: crash safety).
"""

from __future__ import annotations

import json
import secrets
import shutil
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from bot.events import Delivery, UserMessage, agent_key
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.mongo.store import MongoStore
from memory.places import DM
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from tests.conftest import make_settings
from tests.fake_llm import FakeLLMServer, Reply, reply_text, reply_tool_calls, tool_call
from tests.mongo_server import MongoTarget, mongo_target
from tests.test_cli import base_env, memgpt, ok
from tests.test_forget_scan import Needles, file_hits, labels, mongo_hits, open_runtime, sqlite_hits, text_patterns

__all__ = ["mongo_target"]

PLATFORM = "slack"
BACKENDS = ["sqlite", "mongodb"]


def word(stem: str) -> str:
    """One word no tokenizer splits nor stemmer shortens, unique to this run."""
    return f"{stem}{secrets.token_hex(6)}0"


@dataclass
class Person:
    label: str
    user_id: str = field(init=False)
    topic: str = field(init=False)  # what they ask to forget: said, answered, saved as a note
    beside: str = field(init=False)  # in their event's platform payload only, never in memory
    events: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.user_id = f"T9:U{secrets.token_hex(6).upper()}"
        self.topic = word(f"{self.label}topic")
        self.beside = word(f"{self.label}payload")

    @property
    def key(self) -> str:
        return agent_key(PLATFORM, self.user_id)

    def needles(self) -> Needles:
        return Needles({"topic": text_patterns(self.topic), "payload": text_patterns(self.beside)}, {})


def model(request: dict[str, Any]) -> Reply:
    """Says the topic back and notes it (a ledger item); anything else: "Noted."."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return reply_text("(waiting)")
    text = last["content"] if isinstance(last["content"], str) else json.dumps(last["content"])
    topic = next((part for part in text.split() if "topic" in part), "")
    if not topic:
        return reply_tool_calls(tool_call("send_message", {"message": "Noted."}))
    return reply_tool_calls(
        tool_call("core_memory_append", {"name": "human", "content": f"Keeps a {topic}.", "request_heartbeat": False}),
        tool_call("send_message", {"message": f"A {topic}, noted."}),
    )


async def chat(runtime: Runtime, person: Person, text: str) -> None:
    """One message through the inbox and the outbox, as an adapter handles it."""
    event = UserMessage(platform=PLATFORM, user_id=person.user_id, text=text, place=DM, in_inbox=True)
    event.reply_to = {"channel": "D1"}
    payload = {"text": text, "user": person.user_id, "client_msg_id": person.beside}
    assert await runtime.receive(PLATFORM, event.event_id, person.user_id, payload)
    replies = await runtime.handle(event)
    assert replies
    for reply in replies:
        await runtime.report_delivery(reply, Delivery.SENT)
    await runtime.finished(event.event_id)
    person.events.append(event.event_id)


async def tell(runtime: Runtime, person: Person) -> None:
    await chat(runtime, person, f"I keep a {person.topic} in the shed.")
    await chat(runtime, person, "I love hiking.")


# -- the scans ------------------------------------------------------------------------
def sqlite_copy_hits(data: Path, copy: Path, needles: Needles) -> set[str]:
    """A copy of the data folder, taken now: the raw bytes of every file (the
    database, its -wal and -shm among them), then every table of the copied database."""
    shutil.copytree(data, copy)
    database = copy / "memgpt.sqlite3"
    return file_hits(copy, needles) | sqlite_hits(database, needles)


def inbox_and_outbox(store: Store, uri: str, database: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every inbox row and outbox entry as stored: (event id, state, payload), (id, state, text)."""
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(f"file:{store.path}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT event_id, state, payload FROM event_journal").fetchall()
            replies = conn.execute("SELECT id, state, text FROM outbox").fetchall()
        return (
            [{"_id": i, "state": s, "payload": json.loads(p)} for i, s, p in rows],
            [{"_id": i, "state": s, "text": t} for i, s, t in replies],
        )
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=5000)
    try:
        return list(client[database]["event_journal"].find()), list(client[database]["outbox"].find())
    finally:
        client.close()


@dataclass
class World:
    backend: str
    runtime: Runtime
    data: Path
    mongo: MongoTarget | None

    @property
    def store(self) -> Store:
        return self.runtime.store

    @property
    def database(self) -> str:
        return self.store.database if isinstance(self.store, MongoStore) else ""

    def hits(self, needles: Needles, copy: Path) -> set[str]:
        if isinstance(self.store, SQLiteStore):
            return sqlite_copy_hits(self.data, copy, needles)
        assert self.mongo is not None
        return mongo_hits(self.mongo.uri, self.database, needles)

    def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return inbox_and_outbox(self.store, self.mongo.uri if self.mongo else "", self.database)


@asynccontextmanager
async def world(
    backend: str, tmp_path: Path, llm: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> AsyncIterator[World]:
    llm.set_handler(model)
    data = tmp_path / "data"
    mongo: MongoTarget | None = request.getfixturevalue("mongo_target") if backend == "mongodb" else None
    store: Store = mongo.store() if mongo is not None else SQLiteStore(data / "memgpt.sqlite3")
    w = World(backend, await open_runtime(make_settings(data), store, llm, embedder), data, mongo)
    try:
        yield w
    finally:
        await w.runtime.close(close_embedder=False)


async def told(w: World) -> tuple[Person, Person]:
    """Two people told the bot their topics; the scan sees both in the inbox and the outbox."""
    gone, kept = Person("gone"), Person("kept")
    for person in (gone, kept):
        await tell(w.runtime, person)
    before = w.hits(gone.needles(), w.data.parent / "before")
    for table in ("event_journal", "outbox"):
        holding = {hit for hit in before if hit.endswith(f"in table {table}") or hit.endswith(f"collection {table}")}
        assert holding, f"the scenario left nothing in {table}"
    assert labels(before) == {"topic", "payload"}
    return gone, kept


async def check_left(w: World, gone: Person, kept: Person, needles: Needles, *, whole: bool = False) -> None:
    after = w.hits(needles, w.data.parent / "after")
    assert sorted(after) == [], "left behind after the forget:\n" + "\n".join(sorted(after))
    # The other person is untouched, and the scan still sees them.
    assert labels(w.hits(kept.needles(), w.data.parent / "kept")) == {"topic", "payload"}
    rows, replies = w.rows()
    mine = [row for row in rows if row["_id"] in gone.events]
    # Every finished event is still known by its id (a repeat delivery is dropped), its words gone.
    assert len(mine) == len(gone.events) and {row["state"] for row in mine} == {"done"}
    assert all(row["payload"] == {} for row in mine)
    assert all(reply["text"] == "" for reply in replies if reply["_id"].split(":")[0] in gone.events)
    for event_id in gone.events:
        payload = {"text": "again", "user": gone.user_id, "client_msg_id": "x"}
        assert not await w.runtime.receive(PLATFORM, event_id, gone.user_id, payload)
    if whole:
        assert await w.store.find_agent(gone.key) is None


# -- the paths ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
async def test_forget_everything_leaves_no_copy_in_the_inbox_or_outbox(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        gone, kept = await told(w)
        assert await w.runtime.forget(gone.key)
        needles = gone.needles()
        needles.patterns |= {"user id": text_patterns(gone.user_id), "agent key": text_patterns(gone.key)}
        await check_left(w, gone, kept, needles, whole=True)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_forget_a_topic_through_the_runtime_leaves_no_copy(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        gone, kept = await told(w)
        receipt = (await w.runtime.forget_topic(gone.key, gone.topic)).text()
        assert receipt.startswith("Forgotten: ") and "1 note" in receipt
        await check_left(w, gone, kept, gone.needles())
        # What was not about the topic is still known.
        record = await w.store.find_agent(gone.key)
        assert record is not None
        assert any("I love hiking." in (m.content or "") for m in await w.store.messages_since(record.id, 0))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_forget_a_topic_with_the_cli_leaves_no_copy(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        gone, kept = await told(w)
        env = base_env(llm_server.base_url, w.data)
        if isinstance(w.store, MongoStore):
            assert w.mongo is not None
            env |= {"MONGODB_URI": w.mongo.uri, "MONGODB_DB": w.database}
        else:
            await w.runtime.close(close_embedder=False)  # the bot stopped, as an operator would
        args = ("memory", "forget", "--user", f"{PLATFORM}:{gone.user_id}", "--about", gone.topic, "--yes")
        said = ok(memgpt(*args, env=env, cwd=tmp_path))
        assert "Forgotten: " in said
        if isinstance(w.store, SQLiteStore):
            w.runtime = await open_runtime(make_settings(w.data), SQLiteStore(w.store.path), llm_server, embedder)
        await check_left(w, gone, kept, gone.needles())


@pytest.mark.parametrize("backend", BACKENDS)
async def test_forget_one_item_leaves_no_copy_in_the_inbox_or_outbox(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        gone, kept = await told(w)
        page = await w.runtime.ledger(gone.key)
        assert page is not None
        note = next(item for item in page.items if item.kind == "note" and gone.topic in item.text)
        assert (await w.runtime.forget_one(gone.key, note.id)).text().startswith("Forgotten: ")
        # One item goes from memory, the person's messages stay there (the topic too);
        # what only the inbox held (the payload's word) is gone from everywhere.
        await check_left(w, gone, kept, Needles({"payload": text_patterns(gone.beside)}, {}))
        rows, replies = w.rows()
        inbox = json.dumps([row["payload"] for row in rows if row["_id"] in gone.events])
        outbox = json.dumps([reply["text"] for reply in replies if reply["_id"].split(":")[0] in gone.events])
        assert gone.topic not in inbox + outbox
