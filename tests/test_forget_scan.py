"""`/forget` and `memgpt-bot memory forget` leave nothing of the user behind.

A user gets everything the bot can hold on someone: messages (with recall
embeddings, computed by a conversation_search), archival passages (enough to
cross the ANN threshold, so an index file is written beside the database),
working-context edits, an uploaded document, imported history, a reminder the
agent set, check-in schedules and preferences, an attached shared collection,
journalled events and outbox replies, usage counters and agent leases. Then
they are forgotten, and the storage is scanned *generically*: every table of
the SQLite file (FTS shadow tables included), every column, text and BLOB,
every file under the data folder (the WAL and the ANN folder too), and every
collection of the MongoDB database. A table or collection added later is
scanned without changing this file (EXPECTED_TABLES only checks that the
scenario does put something in the tables known today).

What is looked for: the user's id, their agent key and agent id, strings only
they ever said or the agent saved for them, and the raw bytes of one of their
stored embeddings. The same scan runs before the forget and must find every
one of them (so a blind scan cannot pass), and a second user's data must
survive the forget.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bson import Binary
from pymongo import MongoClient

from bot.config import Settings
from bot.events import FileUploaded, UserMessage, agent_key
from bot.llm import LLMClient
from bot.runtime import Runtime
from bot.settings import LeaseSettings
from memory.embeddings import Embedder
from memory.mongo.store import MongoStore
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from memory.types import Message, Passage
from tests.conftest import make_settings
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call
from tests.mongo_server import MongoTarget, mongo_target
from tests.test_cli import base_env, memgpt, ok

__all__ = ["mongo_target"]  # the session fixture, imported to be found here

ANN_THRESHOLD = 8  # passages per agent before an ANN index file is written
PASSAGES = ANN_THRESHOLD + 4
PLATFORM = "slack"


def token(word: str) -> str:
    """A single word no tokenizer splits, unique to this run."""
    return f"{word}{secrets.token_hex(8)}"


@dataclass
class Person:
    """One user and the unique strings only they ever produced."""

    label: str
    user_id: str = field(init=False)
    words: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.user_id = f"T9:U{secrets.token_hex(6).upper()}"
        self.words = {
            kind: token(f"{self.label}{kind}")
            for kind in ("said", "name", "archival", "block", "reminder", "reply", "upload", "imported", "channel")
        }

    @property
    def key(self) -> str:
        return agent_key(PLATFORM, self.user_id)

    def event(self, text: str) -> UserMessage:
        # Durable, as adapters that report deliveries make them: the replies go
        # through the outbox (bot/durable/inbox.py).
        return UserMessage(
            platform=PLATFORM,
            user_id=self.user_id,
            text=text,
            display_name=self.words["name"],
            reply_to={"channel": self.words["channel"]},
            in_inbox=True,
        )


# -- what the user leaves in storage ------------------------------------------
def script_turn(llm: FakeLLMServer, person: Person) -> None:
    """The model saves everything it can about the person, searches both
    stores (recall search embeds the messages; archival search, over the ANN
    threshold, builds the index), then answers."""
    words = person.words
    llm.script(
        reply_tool_calls(
            *(
                tool_call(
                    "archival_memory_insert",
                    {"content": f"Fact {n} about them: {words['archival']} {n}.", "request_heartbeat": False},
                )
                for n in range(PASSAGES)
            ),
            tool_call(
                "core_memory_append",
                {"name": "human", "content": f"Goes by {words['block']}.", "request_heartbeat": False},
            ),
            tool_call(
                "schedule_reminder",
                {"when": "in 3 hours", "note": f"Ask about {words['reminder']}.", "request_heartbeat": True},
            ),
        ),
        reply_tool_calls(
            tool_call("conversation_search", {"query": words["said"], "request_heartbeat": True}),
            tool_call("archival_memory_search", {"query": words["archival"], "request_heartbeat": True}),
        ),
        reply_tool_calls(tool_call("send_message", {"message": f"Noted, {words['reply']}."})),
        # The upload's event: a short acknowledgement.
        reply_tool_calls(tool_call("send_message", {"message": "Read it."})),
    )


async def populate(runtime: Runtime, llm: FakeLLMServer, person: Person, collection_id: str) -> str:
    """Everything the bot can hold on `person`; returns their agent id."""
    words = person.words
    script_turn(llm, person)
    message = person.event(f"Remember {words['said']} please.")
    # In the inbox as an adapter records it; left pending (as after a crash).
    await runtime.receive(PLATFORM, message.event_id, person.user_id, {"text": message.text, "user": person.user_id})
    replies = await runtime.handle(message)
    assert [reply.text for reply in replies] == [f"Noted, {words['reply']}."]
    upload = FileUploaded(
        platform=PLATFORM,
        user_id=person.user_id,
        filename=f"{words['upload']}.md",
        data=f"# Notes\n\nThe upload says {words['upload']}.\n".encode(),
        reply_to={"channel": words["channel"]},
        in_inbox=True,
    )
    await runtime.receive(PLATFORM, upload.event_id, person.user_id, {"file": upload.filename})
    replies = await runtime.handle(upload)
    assert replies[0].text.startswith(f"Saved {words['upload']}.md")
    await runtime.finished(upload.event_id)
    await runtime.import_history(person.key, [Message(role="user", content=f"Long ago: {words['imported']}.")])
    reply_to = {"channel": words["channel"]}
    for command in ("daily 09:00", "tz Europe/Paris", "quiet 22:00-07:00"):
        await runtime.checkin_command(PLATFORM, person.user_id, command, reply_to)
    record = await runtime.store.find_agent(person.key)
    assert record is not None
    await runtime.store.attach_source(collection_id, record.id)
    await runtime.archival.settle(record.id)
    return record.id


async def shared_collection(runtime: Runtime) -> str:
    """A collection attached to both users: it is not theirs, it must stay."""
    source, _ = await runtime.store.create_source("handbook")
    await runtime.archival.insert(source.id, [Passage("Water tomatoes at dawn.", source="handbook.md")])
    return source.id


# -- what to look for -----------------------------------------------------------
@dataclass
class Needles:
    """Byte patterns, by what they are, that must not survive the forget."""

    patterns: dict[str, list[bytes]]
    vectors: dict[str, np.ndarray]  # known embeddings, compared by value in MongoDB documents

    def found_in(self, data: bytes) -> set[str]:
        return {label for label, options in self.patterns.items() if any(option in data for option in options)}


def text_patterns(text: str) -> list[bytes]:
    # FTS5 keeps tokens lowercased and prefix-compressed against the previous
    # term: the random tail is what survives that, so it is searched too.
    forms = {text, text.lower(), text[-12:].lower()}
    return [form.encode() for form in forms]


def needles_for(person: Person, agent_id: str, blobs: dict[str, bytes]) -> Needles:
    patterns: dict[str, list[bytes]] = {
        "user id": text_patterns(person.user_id),
        "agent key": text_patterns(person.key),
        "agent id": text_patterns(agent_id),
    }
    patterns.update({f"'{kind}' text": text_patterns(word) for kind, word in person.words.items()})
    vectors: dict[str, np.ndarray] = {}
    for label, blob in blobs.items():
        vector = np.frombuffer(blob, dtype="<f4")
        # The first 16 floats are unique enough; the ANN file keeps float16.
        patterns[label] = [blob[:64], vector[:16].astype("<f2").tobytes()]
        vectors[label] = vector
    return Needles(patterns, vectors)


def stored_embeddings(db: Path, agent_id: str) -> dict[str, bytes]:
    """One archival and one recall embedding of the agent, as stored."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (passage,) = conn.execute(
            "SELECT embedding FROM passages WHERE agent_id = ? AND embedding IS NOT NULL LIMIT 1", (agent_id,)
        ).fetchone()
        (message,) = conn.execute(
            "SELECT embedding FROM messages WHERE agent_id = ? AND embedding IS NOT NULL LIMIT 1", (agent_id,)
        ).fetchone()
    return {"archival embedding": bytes(passage), "recall embedding": bytes(message)}


# -- the scans ------------------------------------------------------------------
def as_bytes(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


def sqlite_hits(db: Path, needles: Needles) -> set[str]:
    """Every table (virtual, FTS shadow and any added later), every column."""
    found: set[str] = set()
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert "messages_fts_data" in tables and "passages" in tables  # shadow tables are listed too
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if value is not None:  # numbers too: an id may be stored as one
                        found |= {f"{label} in table {table}" for label in needles.found_in(as_bytes(value))}
    return found


def file_hits(folder: Path, needles: Needles, *, skip: Iterable[Path] = ()) -> set[str]:
    """Every file under `folder`, raw bytes and file names."""
    found: set[str] = set()
    skipped = set(skip)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p not in skipped):
        where = path.relative_to(folder)
        found |= {f"{label} in file {where}" for label in needles.found_in(path.read_bytes())}
        found |= {f"{label} in the name {where}" for label in needles.found_in(str(where).encode())}
    return found


def walk(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        yield from value.keys()
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list | tuple):
        yield value
        for item in value:
            yield from walk(item)
    else:
        yield value


def mongo_hits(uri: str, database: str, needles: Needles) -> set[str]:
    """Every document of every collection: strings, binaries, and float
    arrays compared with the known embeddings."""
    found: set[str] = set()
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=5000)
    try:
        db = client[database]
        for name in db.list_collection_names():
            for document in db[name].find():
                for value in walk(document):
                    if isinstance(value, list):
                        if len(value) >= 16 and all(isinstance(x, float) for x in value[:16]):
                            found |= {
                                f"{label} in collection {name}"
                                for label, vector in needles.vectors.items()
                                if np.allclose(np.asarray(value[:16], dtype=np.float32), vector[:16], atol=1e-6)
                            }
                    elif isinstance(value, str | bytes | Binary):
                        found |= {f"{label} in collection {name}" for label in needles.found_in(as_bytes(value))}
    finally:
        client.close()
    return found


def labels(hits: set[str]) -> set[str]:
    return {hit.split(" in ")[0] for hit in hits}


# Tables the scenario must have put something of the user in (where the schema
# has them): the scan of the other tables is only as good as the scenario.
EXPECTED_TABLES = {
    "agents",
    "blocks",
    "messages",
    "messages_fts_content",
    "passages",
    "schedules",
    "checkin_prefs",
    "documents",
    "source_attachments",
    "event_journal",
    "outbox",
    "usage_hits",
}


def assert_covered(db: Path, before: set[str]) -> None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        schema = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    holding = {hit.rsplit(" in table ", 1)[1] for hit in before if " in table " in hit}
    missing = sorted(EXPECTED_TABLES & schema - holding)
    assert missing == [], f"the scenario left nothing in {missing}"


def checkpoint(db: Path) -> None:
    # Stored rows of a live runtime may still sit in the WAL; the raw file
    # scan of the positive control wants them in the main file too.
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(FULL)")


# -- SQLite: /forget through the runtime ------------------------------------------
def settings_for(data: Path) -> Settings:
    # Usage limits on (the suite's default is off): their counters are the user's too.
    return make_settings(data, rate_limit_per_minute=1_000, daily_token_budget=10**9)


async def open_runtime(settings: Settings, store: Store, llm: FakeLLMServer, embedder: Embedder) -> Runtime:
    client = LLMClient(
        settings.model,
        api_key=settings.openai_api_key,
        base_url=llm.base_url,
        timeout=settings.llm_timeout,
        max_retries=settings.llm_max_retries,
    )
    return await Runtime.create(settings, store=store, llm=client, embedder=embedder)


async def two_users(runtime: Runtime, llm: FakeLLMServer) -> tuple[Person, str, Person, str]:
    collection = await shared_collection(runtime)
    gone, kept = Person("gone"), Person("kept")
    gone_id = await populate(runtime, llm, gone, collection)
    kept_id = await populate(runtime, llm, kept, collection)
    return gone, gone_id, kept, kept_id


async def test_forget_leaves_nothing_in_the_sqlite_file_or_the_data_folder(
    tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder
) -> None:
    # Leases on, as with several bot processes on one file: their tables too.
    data = tmp_path / "data"
    db = data / "memgpt.sqlite3"
    settings = settings_for(data)
    settings.leases = LeaseSettings(mode="on")
    runtime = await open_runtime(settings, SQLiteStore(db, ann_threshold=ANN_THRESHOLD), llm_server, embedder)
    try:
        gone, gone_id, kept, kept_id = await two_users(runtime, llm_server)
        assert isinstance(runtime.store, SQLiteStore)
        await runtime.store.wait_for_search_indexes()
        ann = data / "memgpt.sqlite3.ann"
        assert (ann / f"{gone_id}.usearch").exists(), "the archive did not cross the ANN threshold"
        needles = needles_for(gone, gone_id, stored_embeddings(db, gone_id))
        survivors = needles_for(kept, kept_id, stored_embeddings(db, kept_id))

        checkpoint(db)
        before = sqlite_hits(db, needles) | file_hits(data, needles)
        assert labels(before) == set(needles.patterns), "the scan cannot see some of what the user left"
        assert_covered(db, before)

        assert await runtime.forget(agent_key(PLATFORM, gone.user_id))
        # The bot keeps running: the WAL and the ANN folder are scanned as they are now.
        after = sqlite_hits(db, needles) | file_hits(data, needles)
        assert sorted(after) == [], "left behind after /forget (bot running):\n" + "\n".join(sorted(after))
    finally:
        await runtime.close(close_embedder=False)
    after = sqlite_hits(db, needles) | file_hits(data, needles)
    assert sorted(after) == [], "left behind after /forget (bot stopped):\n" + "\n".join(sorted(after))
    # The other user is untouched (and the scan still sees them).
    assert labels(sqlite_hits(db, survivors) | file_hits(data, survivors)) == set(survivors.patterns)


# -- SQLite: `memgpt-bot memory forget` ---------------------------------------------
async def test_the_cli_forget_leaves_nothing_either(
    tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder
) -> None:
    data = tmp_path / "data"
    db = data / "memgpt.sqlite3"
    settings = settings_for(data)
    runtime = await open_runtime(settings, SQLiteStore(db, ann_threshold=ANN_THRESHOLD), llm_server, embedder)
    try:
        gone, gone_id, _, _ = await two_users(runtime, llm_server)
        assert isinstance(runtime.store, SQLiteStore)
        await runtime.store.wait_for_search_indexes()
        needles = needles_for(gone, gone_id, stored_embeddings(db, gone_id))
    finally:
        await runtime.close(close_embedder=False)
    assert (data / "memgpt.sqlite3.ann" / f"{gone_id}.usearch").exists()
    assert labels(sqlite_hits(db, needles) | file_hits(data, needles)) == set(needles.patterns)

    env = base_env(llm_server.base_url, data)
    said = ok(memgpt("memory", "forget", "--user", f"{PLATFORM}:{gone.user_id}", "--yes", env=env, cwd=tmp_path))
    assert said.startswith(f"Forgot {gone.key}")
    log = data / "memgpt-bot.log"
    after = sqlite_hits(db, needles) | file_hits(data, needles, skip=[log])
    assert sorted(after) == [], "left behind after the CLI forget:\n" + "\n".join(sorted(after))
    # The command's log says whom it forgot (an operator's record of the
    # request), and nothing they said or stored.
    identifiers = {"user id", "agent key", "agent id"}
    assert sorted(hit for hit in file_hits(data, needles) if labels({hit}) - identifiers) == []


# -- MongoDB --------------------------------------------------------------------------
async def test_forget_leaves_nothing_in_any_mongodb_collection(
    tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, mongo_target: MongoTarget
) -> None:
    store = mongo_target.store()
    settings = settings_for(tmp_path / "data")
    runtime = await open_runtime(settings, store, llm_server, embedder)  # leases are on with MongoDB
    try:
        gone, gone_id, kept, kept_id = await two_users(runtime, llm_server)
        assert isinstance(runtime.store, MongoStore)
        # Embeddings as MongoDB holds them (float arrays), by value.
        blobs = mongo_embeddings(mongo_target.uri, store.database, gone_id)
        needles = needles_for(gone, gone_id, blobs)
        survivors = needles_for(kept, kept_id, mongo_embeddings(mongo_target.uri, store.database, kept_id))
        before = mongo_hits(mongo_target.uri, store.database, needles)
        assert labels(before) == set(needles.patterns), "the scan cannot see some of what the user left"

        assert await runtime.forget(agent_key(PLATFORM, gone.user_id))
        after = mongo_hits(mongo_target.uri, store.database, needles)
        assert sorted(after) == [], "left behind after /forget:\n" + "\n".join(sorted(after))
        assert labels(mongo_hits(mongo_target.uri, store.database, survivors)) == set(survivors.patterns)
    finally:
        await runtime.close(close_embedder=False)


def mongo_embeddings(uri: str, database: str, agent_id: str) -> dict[str, bytes]:
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=5000)
    try:
        db = client[database]
        passage = db["passages"].find_one({"agent_id": agent_id, "embedded": True})
        message = db["message_vectors"].find_one({"agent_id": agent_id})
    finally:
        client.close()
    assert passage is not None and message is not None
    return {
        "archival embedding": np.asarray(passage["embedding"], dtype="<f4").tobytes(),
        "recall embedding": np.asarray(message["embedding"], dtype="<f4").tobytes(),
    }


async def test_forget_of_someone_who_only_set_check_ins(
    tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder
) -> None:
    # No agent was ever created: the forget deletes schedules only, and the
    # WAL must still be emptied of them.
    data = tmp_path / "data"
    db = data / "memgpt.sqlite3"
    runtime = await open_runtime(settings_for(data), SQLiteStore(db), llm_server, embedder)
    try:
        person = Person("checkins")
        for command in ("daily 09:00", "tz Europe/Paris"):
            await runtime.checkin_command(PLATFORM, person.user_id, command, {"channel": person.words["channel"]})
        assert await runtime.store.find_agent(person.key) is None
        needles = Needles(
            {"user id": text_patterns(person.user_id), "'channel' text": text_patterns(person.words["channel"])}, {}
        )
        checkpoint(db)
        assert labels(sqlite_hits(db, needles) | file_hits(data, needles)) == set(needles.patterns)
        assert await runtime.forget(agent_key(PLATFORM, person.user_id))
        after = sqlite_hits(db, needles) | file_hits(data, needles)
        assert sorted(after) == [], "left behind after /forget:\n" + "\n".join(sorted(after))
    finally:
        await runtime.close(close_embedder=False)
