"""Working context stored before its lines had places opens as written in the
DM (the safe side): shown in the person's DMs, in no channel; the operator's
default text stays shown everywhere; one log line per agent. SQLite through
migration m014, MongoDB through the upgrade at open (idempotent)."""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory.mongo.store import MongoStore
from memory.places import DM, Place
from memory.sqlite.migrations import MIGRATIONS, m014_block_lines, migrate
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from memory.types import OPERATOR_KEY
from memory.working_context import DEFAULT_HUMAN, DEFAULT_PERSONA, WorkingContext
from tests.mongo_server import MongoTarget, mongo_store, mongo_target
from tests.test_places_migration import old_mongo

__all__ = ["mongo_store", "mongo_target", "old_mongo"]  # fixtures, imported to be found here

T0 = datetime(2025, 3, 4, 8, 0, tzinfo=UTC)
PUBLIC = Place("public", "C1", "#general")
TEAM = Place("private", "G1", "#team")
# agent id, key, label, value: as the release before block lines stored them.
OLD_BLOCKS = [
    ("a1", "slack:alice", "persona", DEFAULT_PERSONA),
    ("a1", "slack:alice", "human", "Alice. Diagnosed with hypothyroidism.\nLikes tea"),
    ("a1", "slack:alice", "private", "her sister's name is Ruth"),
    ("a2", "slack:bob", "persona", DEFAULT_PERSONA),
    ("a2", "slack:bob", "human", DEFAULT_HUMAN),
    ("a2", "slack:bob", "private", ""),
]
EXPECTED_LOG = ["agent slack:alice: 3 working-context lines from before places count as written in the DM"]


def log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "working-context lines" in r.getMessage()]


async def assert_written_in_the_dm(store: Store) -> None:
    alice = WorkingContext(await store.load_blocks("a1"))
    human = alice.get("human")
    assert [(line.text, line.place) for line in human.lines] == [
        ("Alice. Diagnosed with hypothyroidism.", DM.key),
        ("Likes tea", DM.key),
    ]
    assert all(line.written_at == T0 for line in human.lines)
    assert len({line.id for line in human.lines}) == 2
    assert "hypothyroidism" in alice.render(DM) and "Ruth" in alice.render(DM)
    for place in (PUBLIC, TEAM):
        shown = alice.render(place)
        assert "hypothyroidism" not in shown and "tea" not in shown and "Ruth" not in shown
        assert DEFAULT_PERSONA in shown, "the operator's persona is shown everywhere"
    bob = WorkingContext(await store.load_blocks("a2"))
    assert [line.place for block in bob.blocks.values() for line in block.lines] == [OPERATOR_KEY, OPERATOR_KEY]
    assert DEFAULT_HUMAN in bob.render(PUBLIC)


# -- SQLite ------------------------------------------------------------------
def write_old_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(conn, MIGRATIONS[: MIGRATIONS.index(m014_block_lines)])
        conn.execute("BEGIN")
        for n, agent_id in enumerate(("a1", "a2")):
            key = next(key for owner, key, _, _ in OLD_BLOCKS if owner == agent_id)
            row = (agent_id, key, T0.timestamp() + n)
            conn.execute("INSERT INTO agents (id, key, created_at) VALUES (?, ?, ?)", row)
        conn.executemany(
            'INSERT INTO blocks (agent_id, label, value, "limit", updated_at, position) VALUES (?, ?, ?, 2000, ?, ?)',
            [(a, label, value, T0.timestamp(), n) for n, (a, _, label, value) in enumerate(OLD_BLOCKS)],
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_old_sqlite_blocks_open_as_written_in_the_dm(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "memory.db"
    write_old_sqlite(path)
    caplog.set_level(logging.INFO)
    for run in range(2):  # recorded once: a second open changes nothing
        caplog.clear()
        store = SQLiteStore(path)
        await store.open()
        try:
            assert log_lines(caplog) == (EXPECTED_LOG if run == 0 else [])
            await assert_written_in_the_dm(store)
        finally:
            await store.close()
    conn = sqlite3.connect(path)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(blocks)")}
    finally:
        conn.close()
    assert "value" not in columns and "lines" in columns, "one source of truth: the lines"


# -- MongoDB -----------------------------------------------------------------
async def test_old_mongodb_blocks_open_as_written_in_the_dm(
    old_mongo: MongoStore, mongo_target: MongoTarget, caplog: pytest.LogCaptureFixture
) -> None:
    us = int(T0.timestamp() * 1_000_000)
    for n, agent_id in enumerate(("a1", "a2")):
        key = next(key for owner, key, _, _ in OLD_BLOCKS if owner == agent_id)
        await old_mongo._c("agents").insert_one({"_id": agent_id, "key": key, "created_at": us + n, "ready": True})
    await old_mongo._c("blocks").insert_many(
        [
            {"agent_id": a, "label": label, "value": value, "limit": 2000, "updated_at": us, "position": n}
            for n, (a, _, label, value) in enumerate(OLD_BLOCKS)
        ]
    )
    caplog.set_level(logging.INFO)
    for run in range(2):  # idempotent: a second open changes nothing
        caplog.clear()
        store = mongo_target.reopened(old_mongo.database)
        await store.open()
        try:
            assert log_lines(caplog) == (EXPECTED_LOG if run == 0 else [])
            await assert_written_in_the_dm(store)
            assert await store._c("blocks").count_documents({"value": {"$exists": True}}) == 0
        finally:
            await store.close()
