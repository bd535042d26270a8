"""Archives stored before archival search used analysed terms are searched by
them once opened: SQLite re-indexes its passages in migration m013, MongoDB
re-analyses the passages' stored terms at open. Both log how many, once."""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from memory.mongo.keywords import ANALYSIS_VERSION
from memory.mongo.store import MongoStore
from memory.sqlite.migrations import MIGRATIONS, m013_passage_terms, migrate
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from tests.mongo_server import MongoTarget, mongo_store, mongo_target
from tests.test_places_migration import old_mongo

__all__ = ["mongo_store", "mongo_target", "old_mongo"]  # the fixtures, imported to be found here

T0 = datetime(2024, 5, 17, 9, 30, tzinfo=UTC)
# The answer's vector is the farthest from the query: only its keyword bonus
# (a stemmed match, then an exact code among look-alikes) can put it first.
PASSAGES = [
    ("Caroline is researching adoption agencies, file AB-12-CD.", [0.6, 0.8]),
    ("Caroline went hiking, file AB-12-CE.", [1.0, 0.0]),
    ("The weather was rainy all week, file CD-12-AB.", [0.99, 0.14]),
]


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "archival passages" in r.getMessage()]


async def assert_searched_by_terms(store: Store, agent_id: str) -> None:
    page = await store.search_passages(agent_id, "What did she research?", [1.0, 0.0], 3)
    assert page.items[0][0].text == PASSAGES[0][0]
    page = await store.search_passages(agent_id, "file AB-12-CD", [1.0, 0.0], 3)
    assert page.items[0][0].text == PASSAGES[0][0]


# -- SQLite ------------------------------------------------------------------
def write_old_sqlite(path: Path) -> None:
    """A database as the release before m013 left it (its FTS5 rows made by the m004 triggers)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(conn, MIGRATIONS[: MIGRATIONS.index(m013_passage_terms)])
        conn.execute("INSERT INTO agents (id, key, created_at) VALUES ('a1', 'discord:alice', ?)", (T0.timestamp(),))
        conn.executemany(
            "INSERT INTO passages (agent_id, text, created_at, embedding) VALUES ('a1', ?, ?, ?)",
            [(text, T0.timestamp(), np.asarray(vector, dtype="<f4").tobytes()) for text, vector in PASSAGES],
        )
    finally:
        conn.close()


async def test_an_old_sqlite_archive_is_reindexed_by_analysed_terms(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "memory.db"
    write_old_sqlite(path)
    caplog.set_level(logging.INFO)
    for run in range(2):
        caplog.clear()
        store = SQLiteStore(path)
        await store.open()
        try:
            expected = ["re-indexed 3 archival passages for keyword search by analysed terms"]
            assert logged(caplog) == (expected if run == 0 else [])
            await assert_searched_by_terms(store, "a1")
        finally:
            await store.close()

    # Deleting a passage (or its agent) empties its index row.
    store = SQLiteStore(path)
    await store.open()
    try:
        [first] = await store.list_passages("a1", 1)
        assert first.id is not None
        await store.delete_passages("a1", [first.id])
        assert await store.run_in_db(lambda db: db.execute("SELECT count(*) FROM passages_fts").fetchone()[0]) == 2
        await store.delete_agent("a1")
        assert await store.run_in_db(lambda db: db.execute("SELECT count(*) FROM passages_fts").fetchone()[0]) == 0
    finally:
        await store.close()


# -- MongoDB -----------------------------------------------------------------
async def test_old_mongodb_passages_are_reanalysed_at_open(
    old_mongo: MongoStore, mongo_target: MongoTarget, caplog: pytest.LogCaptureFixture
) -> None:
    await old_mongo._c("agents").insert_one({"_id": "a1", "key": "discord:alice", "created_at": 0, "ready": True})
    # The old shape: the distinct folded words, unstemmed, and no `analysed`.
    await old_mongo._c("passages").insert_many(
        [
            {
                "_id": n,
                "agent_id": "a1",
                "text": text,
                "created_at": 0,
                "place": "dm",
                "embedding": vector,
                "embedded": True,
                "terms": sorted(set(text.casefold().replace(",", " ").replace(".", " ").replace("-", " ").split())),
                "words": len(text.split()),
            }
            for n, (text, vector) in enumerate(PASSAGES, 1)
        ]
    )
    caplog.set_level(logging.INFO)
    for run in range(2):  # idempotent: a second open changes nothing
        caplog.clear()
        store = mongo_target.reopened(old_mongo.database)
        await store.open()
        try:
            expected = ["re-analysed the keyword terms of 3 archival passages (stemmed, identifiers whole)"]
            assert logged(caplog) == (expected if run == 0 else [])
            doc = await store._c("passages").find_one({"_id": 1})
            assert doc is not None and doc["analysed"] == ANALYSIS_VERSION
            assert {"research", "ab 12 cd"} <= set(doc["terms"]) and "researching" not in doc["terms"]
            await assert_searched_by_terms(store, "a1")
        finally:
            await store.close()
