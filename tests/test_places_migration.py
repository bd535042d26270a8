"""Stores written before places open with everything they hold DM-only:
visible from the person's DMs, never from a private or public channel, and
each agent's queue and summary carried into its "dm" conversation. SQLite
through migration m012, MongoDB through the upgrade at open."""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from memory.mongo.keywords import passage_terms, words
from memory.mongo.store import MongoStore
from memory.places import Place, Visibility
from memory.sqlite.migrations import MIGRATIONS, m012_places, migrate
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from tests.mongo_server import MongoTarget, mongo_store, mongo_target

__all__ = ["mongo_store", "mongo_target"]  # the session fixture, imported to be found here

T0 = datetime(2024, 5, 17, 9, 30, tzinfo=UTC)
SUMMARIZED_AT = T0 + timedelta(hours=2)
FROM_DM = Visibility.of(Place())
FROM_PRIVATE = Visibility.of(Place("private", "C1"))
FROM_PUBLIC = Visibility.of(Place("public", "C2"))
TEXTS = [f"old message {n} about the gooseberry" for n in range(5)]


async def assert_dm_only(store: Store, agent_id: str) -> None:
    """What an agent stored before places: all of it in its DMs, none elsewhere."""
    dm = await store.get_conversation(agent_id, "dm")
    assert (dm.summary, dm.queue_start_seq, dm.summary_updated_at) == ("Alice likes gooseberries.", 4, SUMMARIZED_AT)
    assert [c.place for c in await store.list_conversations(agent_id)] == ["dm"]
    queue = await store.messages_since(agent_id, dm.queue_start_seq, place="dm")
    assert [m.content for m in queue] == TEXTS[3:]
    assert {m.place for m in await store.messages_since(agent_id, 0)} == {"dm"}

    assert await store.count_messages(agent_id, visible=FROM_DM) == len(TEXTS)
    assert (await store.search_messages(agent_id, "gooseberry", 10, visible=FROM_DM)).total == len(TEXTS)
    assert await store.count_passages(agent_id, visible=FROM_DM) == 1
    found = await store.search_passages(agent_id, "gooseberry", [1.0, 0.0], 10, visible=FROM_DM)
    assert [p.place for p, _ in found.items] == ["dm"]
    for elsewhere in (FROM_PRIVATE, FROM_PUBLIC):
        assert await store.count_messages(agent_id, visible=elsewhere) == 0
        assert (await store.search_messages(agent_id, "gooseberry", 10, visible=elsewhere)).items == []
        page = await store.search_messages(agent_id, "gooseberry", 10, query_vector=[1.0, 0.0], visible=elsewhere)
        assert page.items == []
        between = await store.messages_between(agent_id, T0, T0 + timedelta(days=1), 10, visible=elsewhere)
        assert between.total == 0
        assert await store.count_passages(agent_id, visible=elsewhere) == 0
        assert await store.list_passages(agent_id, 10, visible=elsewhere) == []
        assert (await store.search_passages(agent_id, "gooseberry", [1.0, 0.0], 10, visible=elsewhere)).items == []


def log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "from before places" in r.getMessage()]


# -- SQLite ------------------------------------------------------------------
def write_old_sqlite(path: Path) -> None:
    """A database as the release before places left it (every migration before m012)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(conn, MIGRATIONS[: MIGRATIONS.index(m012_places)])
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO agents (id, key, created_at, summary, queue_start_seq, summary_updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                ("a1", "discord:alice", T0.timestamp(), "Alice likes gooseberries.", 4, SUMMARIZED_AT.timestamp()),
                ("a2", "discord:quiet", T0.timestamp() + 1, "", 1, None),
            ],
        )
        for n, text in enumerate(TEXTS, 1):
            rowid = conn.execute(
                "INSERT INTO messages (agent_id, seq, role, content, created_at) VALUES ('a1', ?, 'user', ?, ?)",
                (n, text, (T0 + timedelta(minutes=n)).timestamp()),
            ).lastrowid
            conn.execute("INSERT INTO messages_fts (rowid, agent_id, text) VALUES (?, 'a1', ?)", (rowid, text))
        conn.execute(
            "INSERT INTO passages (agent_id, text, created_at, embedding) VALUES ('a1', 'gooseberry jam recipe', ?, ?)",
            (T0.timestamp(), np.asarray([1.0, 0.0], dtype="<f4").tobytes()),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_an_old_sqlite_file_opens_with_its_data_dm_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "memory.db"
    write_old_sqlite(path)
    caplog.set_level(logging.INFO)
    store = SQLiteStore(path)
    await store.open()
    try:
        assert log_lines(caplog) == [
            "agent discord:alice: 5 messages and 1 passages from before places count as DM-only"
        ]
        await assert_dm_only(store, "a1")
        quiet = await store.get_conversation("a2", "dm")
        assert (quiet.summary, quiet.queue_start_seq) == ("", 1)
    finally:
        await store.close()
    # One source of truth: the agents table no longer holds queue state.
    conn = sqlite3.connect(path)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(agents)")}
    finally:
        conn.close()
    assert columns == {"id", "key", "created_at"}

    caplog.clear()
    again = SQLiteStore(path)
    await again.open()
    try:
        assert log_lines(caplog) == []
        await assert_dm_only(again, "a1")
    finally:
        await again.close()


# -- MongoDB -----------------------------------------------------------------
@pytest.fixture
def old_mongo(mongo_store: MongoStore) -> MongoStore:
    """A fresh database (dropped at the end) to write old-shape documents into."""
    return mongo_store


async def write_old_mongo(store: MongoStore) -> None:
    """Documents as the release before places wrote them: queue state on the
    agent, no `place` on messages and passages, no conversations."""
    us = int(T0.timestamp() * 1_000_000)
    agent = {"_id": "a1", "key": "discord:alice", "created_at": us, "ready": True}
    agent.update(summary="Alice likes gooseberries.", queue_start_seq=4)
    agent["summary_updated_at"] = int(SUMMARIZED_AT.timestamp() * 1_000_000)
    await store._c("agents").insert_one(agent)
    await store._c("messages").insert_many(
        [
            {
                "agent_id": "a1",
                "seq": n,
                "batch_end": len(TEXTS),
                "tok_total": 0,
                "role": "user",
                "content": text,
                "created_at": us + n * 60_000_000,
                "terms": sorted(set(words(text))),
            }
            for n, text in enumerate(TEXTS, 1)
        ]
    )
    passage = {"_id": 1, "agent_id": "a1", "text": "gooseberry jam recipe", "created_at": us}
    passage.update(embedding=[1.0, 0.0], embedded=True, **passage_terms("gooseberry jam recipe"))
    await store._c("passages").insert_one(passage)
    await store._c("counters").update_one({"_id": "passage_id"}, {"$set": {"value": 1}}, upsert=True)


async def test_old_mongodb_documents_open_dm_only(
    old_mongo: MongoStore, mongo_target: MongoTarget, caplog: pytest.LogCaptureFixture
) -> None:
    await write_old_mongo(old_mongo)
    caplog.set_level(logging.INFO)
    for run in range(2):  # the upgrade is idempotent: a second open changes nothing
        caplog.clear()
        store = mongo_target.reopened(old_mongo.database)
        await store.open()
        try:
            expected = ["agent discord:alice: 5 messages and 1 passages from before places count as DM-only"]
            assert log_lines(caplog) == (expected if run == 0 else [])
            await assert_dm_only(store, "a1")
            agent = await store._c("agents").find_one({"_id": "a1"})
            assert agent is not None and not {"summary", "queue_start_seq", "summary_updated_at"} & set(agent)
        finally:
            await store.close()
