"""SQLite-only behaviour: what is on disk, reopening, migrations, failures."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memory.sqlite.migrations import MIGRATIONS, RECORDED_AS, Migration, migrate, migration, recorded_name
from memory.sqlite.store import SQLiteStore, fts_terms
from memory.store import StoreError
from memory.types import Block, Message, Passage

T0 = datetime(2024, 5, 17, 9, 30, tzinfo=UTC)
SECRET = "xylophonequartz"


def blocks() -> list[Block]:
    return [Block("persona", "helper", 500), Block("human", "unknown", 500)]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "memory.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SQLiteStore]:
    sqlite_store = SQLiteStore(db_path)
    await sqlite_store.open()
    yield sqlite_store
    await sqlite_store.close()


async def fill(store: SQLiteStore, key: str, word: str) -> str:
    """An agent with `word` in every kind of stored text; returns its id."""
    agent, _ = await store.get_or_create_agent(key, blocks())
    await store.save_block(agent.id, Block("notes", f"likes {word}", 100))
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "core_memory_append", "arguments": f'{{"content": "{word}"}}'},
    }
    await store.append_messages(
        agent.id,
        [
            Message("user", f"my {word} is blue", name=word, created_at=T0),
            Message("assistant", None, tool_calls=[call], created_at=T0),
        ]
        + [Message("user", f"filler {n} about {word}") for n in range(30)],
    )
    ids = await store.insert_passages(agent.id, [Passage(f"{word} facts", source=word)] * 3)
    await store.set_embeddings(agent.id, {ids[0]: [1.0, 0.0], ids[1]: [0.0, 1.0]})
    await store.search_passages(agent.id, word, [1.0, 0.0], 5)  # loads the vector index
    await store.update_queue(agent.id, f"summary mentions {word}", 3, T0)
    return agent.id


def tables_containing(path: Path, needle: str) -> set[str]:
    """Every table (FTS5 shadow tables included) holding `needle` in any cell,
    as text or as bytes inside a BLOB."""
    raw = sqlite3.connect(path)
    try:
        names = [row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        found = set()
        for name in names:
            for row in raw.execute(f'SELECT * FROM "{name}"'):
                for cell in row:
                    if (isinstance(cell, str) and needle in cell) or (
                        isinstance(cell, bytes) and needle.encode() in cell
                    ):
                        found.add(name)
        return found
    finally:
        raw.close()


async def test_delete_agent_leaves_no_trace_in_any_table(store: SQLiteStore, db_path: Path) -> None:
    agent_id = await fill(store, "discord:doomed", SECRET)
    await fill(store, "discord:kept", "marmalade")

    # FTS5 prefix-compresses each term against the one before it, so the
    # agent id token is looked for by its tail, which is always stored whole.
    id_tail = agent_id[8:]
    # The summary (with the secret) lives in the agent's DM conversation.
    everywhere = {"conversations", "blocks", "messages", "passages", "messages_fts_data"}
    # The scan itself must see the FTS index, or the checks below prove nothing.
    assert everywhere <= tables_containing(db_path, SECRET)
    assert everywhere | {"agents"} <= tables_containing(db_path, id_tail)

    await store.delete_agent(agent_id)

    assert tables_containing(db_path, SECRET) == set()
    assert tables_containing(db_path, id_tail) == set()
    assert "messages_fts_data" in tables_containing(db_path, "marmalade")
    assert agent_id not in store._indexes
    await store.close()
    # With secure_delete the freed pages are zeroed too, so even the raw file
    # (checkpointed on close) holds no copy.
    raw = await asyncio.to_thread(db_path.read_bytes)
    assert SECRET.encode() not in raw
    assert id_tail.encode() not in raw


async def test_everything_survives_close_and_reopen(store: SQLiteStore, db_path: Path) -> None:
    agent_id = await fill(store, "slack:persist", "gooseberry")
    before_blocks = await store.load_blocks(agent_id)
    before_messages = await store.messages_since(agent_id, 1)
    await store.close()

    reopened = SQLiteStore(db_path)
    await reopened.open()
    try:
        agent = await reopened.find_agent("slack:persist")
        assert agent is not None and agent.id == agent_id
        dm = await reopened.get_conversation(agent_id, "dm")
        assert (dm.summary, dm.queue_start_seq, dm.summary_updated_at) == (
            "summary mentions gooseberry",
            3,
            T0,
        )
        assert await reopened.load_blocks(agent_id) == before_blocks
        assert await reopened.messages_since(agent_id, 1) == before_messages
        page = await reopened.search_messages(agent_id, "blue", 5)
        assert [m.seq for m in page.items] == [1]
        page = await reopened.search_passages(agent_id, "", [0.0, 1.0], 5)
        assert page.total == 2 and page.items[0][0].embedding == [0.0, 1.0]
        assert len(await reopened.passages_without_embedding(agent_id)) == 1
        more = await reopened.append_messages(agent_id, [Message("user", "after reopen")])
        assert more[0].seq == 33
    finally:
        await reopened.close()


async def test_migrations_recorded_once(store: SQLiteStore, db_path: Path) -> None:
    names = [recorded_name(fn) for fn in MIGRATIONS]
    raw = sqlite3.connect(db_path)
    recorded = raw.execute("SELECT name, applied_at FROM _migrations ORDER BY rowid").fetchall()
    raw.close()
    assert [name for name, _ in recorded] == names

    await store.close()
    await store.open()
    await store.open()  # idempotent
    raw = sqlite3.connect(db_path, isolation_level=None)
    assert raw.execute("SELECT name, applied_at FROM _migrations ORDER BY rowid").fetchall() == (recorded)
    assert migrate(raw, MIGRATIONS) == []
    raw.close()


def test_migrate_applies_only_new_functions_in_order() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    calls: list[str] = []

    def m1(c: sqlite3.Connection) -> None:
        calls.append("m1")
        c.execute("CREATE TABLE t (a)")

    def m2(c: sqlite3.Connection) -> None:
        calls.append("m2")
        c.execute("ALTER TABLE t ADD COLUMN b")

    def broken(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE u (a)")
        raise RuntimeError("half done")

    assert migrate(conn, [m1]) == ["m1"]
    assert migrate(conn, [m1, m2]) == ["m2"]
    assert calls == ["m1", "m2"]
    with pytest.raises(RuntimeError):
        migrate(conn, [m1, m2, broken])
    # A failed migration is rolled back whole and not recorded.
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'u'").fetchone() is None
    assert [r[0] for r in conn.execute("SELECT name FROM _migrations")] == ["m1", "m2"]


def _as_named(fn: Migration, name: str) -> Migration:
    """`fn` under another function name."""

    def renamed(conn: sqlite3.Connection) -> None:
        fn(conn)

    renamed.__name__ = name
    return renamed


def _old_release(count: int) -> list[Migration]:
    """The first `count` migrations as the release before numbering named them."""
    return [_as_named(fn, recorded_name(fn)) for fn in MIGRATIONS[:count]]


def test_migrations_are_numbered_in_order() -> None:
    assert [fn.__name__[:5] for fn in MIGRATIONS] == [f"m{n:03d}_" for n in range(1, len(MIGRATIONS) + 1)]
    assert set(RECORDED_AS) <= {fn.__name__ for fn in MIGRATIONS}

    def m002_out_of_turn(conn: sqlite3.Connection) -> None: ...

    with pytest.raises(ValueError, match=f"must be named m{len(MIGRATIONS) + 1:03d}_"):
        migration(m002_out_of_turn)
    assert m002_out_of_turn not in MIGRATIONS


@pytest.mark.parametrize("done", [len(RECORDED_AS) + 1, 4])
async def test_a_database_of_the_release_before_numbering_runs_none_again(db_path: Path, done: int) -> None:
    # Build the file as the release before numbering did: its migrations under
    # their unnumbered names (all of them, or the first few), and some data.
    db_path.parent.mkdir(parents=True)
    raw = sqlite3.connect(db_path, isolation_level=None)
    old_names = [fn.__name__ for fn in _old_release(done)]
    assert migrate(raw, _old_release(done)) == old_names
    raw.execute("INSERT INTO agents (id, key, created_at) VALUES ('a1', 'discord:alice', 0)")
    raw.close()

    store = SQLiteStore(db_path)
    await store.open()  # would fail if m002... ran again: CREATE TABLE schedules twice
    try:
        assert [agent.key for agent in await store.list_agents()] == ["discord:alice"]
    finally:
        await store.close()
    raw = sqlite3.connect(db_path, isolation_level=None)
    recorded = [row[0] for row in raw.execute("SELECT name FROM _migrations ORDER BY rowid")]
    # Every migration recorded once, in order; and the older release, opening
    # the file again (a rollback), finds nothing of its own left to run.
    assert recorded == [recorded_name(fn) for fn in MIGRATIONS]
    assert migrate(raw, _old_release(len(MIGRATIONS))) == []
    raw.close()


async def test_connection_settings(store: SQLiteStore, db_path: Path) -> None:
    def settings() -> tuple[str, ...]:
        conn = store._db
        return (
            threading.current_thread().name,
            *(
                str(conn.execute(f"PRAGMA {p}").fetchone()[0])
                for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            ),
        )

    thread, journal, synchronous, foreign_keys, busy = await store._call(settings)
    assert thread.startswith("sqlite")
    assert (journal, synchronous, foreign_keys) == ("wal", "1", "1")
    assert int(busy) > 0
    assert db_path.parent.is_dir()


async def test_unwritable_path_is_a_store_error_naming_the_file(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "plain-file"
    not_a_dir.write_text("x")
    for path in (not_a_dir / "sub" / "memory.db", tmp_path):
        store = SQLiteStore(path)
        with pytest.raises(StoreError, match=str(path)):
            await store.open()
        await store.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
async def test_read_only_directory_is_a_store_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        store = SQLiteStore(locked / "memory.db")
        with pytest.raises(StoreError, match=str(locked / "memory.db")):
            await store.open()
        await store.close()
    finally:
        locked.chmod(0o700)


async def test_corrupt_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    path.write_bytes(b"this is not a database" * 400)
    store = SQLiteStore(path)
    with pytest.raises(StoreError, match=str(path)):
        await store.open()
    await store.close()


async def test_calls_after_close_raise_store_error(store: SQLiteStore) -> None:
    await store.close()
    await store.close()  # harmless
    with pytest.raises(StoreError, match="not open"):
        await store.find_agent("discord:x")


async def test_writes_for_unknown_agent_are_store_errors(store: SQLiteStore) -> None:
    with pytest.raises(StoreError):
        await store.append_messages("ghost", [Message("user", "boo")])
    with pytest.raises(StoreError):
        await store.update_queue("ghost", "", 1, T0)


async def test_index_cache_eviction_keeps_results_right(db_path: Path) -> None:
    store = SQLiteStore(db_path, max_cached_indexes=1)
    await store.open()
    try:
        agents = []
        for n in range(3):
            agent, _ = await store.get_or_create_agent(f"discord:{n}", blocks())
            [pid] = await store.insert_passages(agent.id, [Passage(f"agent {n}")])
            await store.set_embeddings(agent.id, {pid: [1.0, float(n)]})
            agents.append(agent)
        for _ in range(2):
            for n, agent in enumerate(agents):
                page = await store.search_passages(agent.id, "", [1.0, 0.0], 5)
                assert [p.text for p, _ in page.items] == [f"agent {n}"]
                assert len(store._indexes) == 1
    finally:
        await store.close()


async def test_message_timestamps_survive_microseconds(store: SQLiteStore) -> None:
    agent, _ = await store.get_or_create_agent("discord:time", blocks())
    moments = [T0 + timedelta(microseconds=n * 999_983) for n in range(200)]
    await store.append_messages(agent.id, [Message("user", "t", created_at=m) for m in moments])
    assert [m.created_at for m in await store.messages_since(agent.id, 1)] == moments


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ("?! ...", None),
        ("🦄", None),
        ("tea AND cake", '"tea" OR "AND" OR "cake"'),
        ('say "hi" -now*', '"say" OR "hi" OR "now"'),
        ("tea tea TEA", '"tea" OR "TEA"'),
        ("ünï-cödé", '"ünï" OR "cödé"'),
    ],
)
def test_fts_terms(text: str, expected: str | None) -> None:
    assert fts_terms(text) == expected


async def test_a_forget_gives_the_space_back_to_the_file_system(store: SQLiteStore, db_path: Path) -> None:
    gone, _ = await store.get_or_create_agent("terminal:gone", blocks())
    kept, _ = await store.get_or_create_agent("terminal:kept", blocks())
    await store.insert_passages(gone.id, [Passage(f"passage {n} " + "x" * 2_000) for n in range(1_500)])
    await store.insert_passages(kept.id, [Passage("a fact to keep")])
    await store.flush_deleted()
    full = await asyncio.to_thread(os.path.getsize, db_path)
    await store.delete_agent(gone.id)
    await store.flush_deleted()
    assert await asyncio.to_thread(os.path.getsize, db_path) < full / 4, "the freed pages stayed in the file"
    assert [p.text for p in await store.list_passages(kept.id, 10)] == ["a fact to keep"]


async def queued_together(store: SQLiteStore, *calls: Any) -> list[Any]:
    """The calls' results (or errors), the calls given to the worker while a job holds
    it, so that it takes them in one wake-up (and their writes in one group commit)."""
    release = threading.Event()
    hold = asyncio.ensure_future(store.run_in_db(lambda conn: release.wait(10)))
    await asyncio.sleep(0.05)  # the worker is inside the holding job
    pending = [asyncio.ensure_future(call) for call in calls]
    await asyncio.sleep(0)  # every call is queued
    release.set()
    await hold
    return await asyncio.gather(*pending, return_exceptions=True)


async def test_group_commit_keeps_each_writes_own_outcome(store: SQLiteStore, db_path: Path) -> None:
    one, _ = await store.get_or_create_agent("slack:T1:U1", blocks())
    two, _ = await store.get_or_create_agent("slack:T1:U2", blocks())

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO usage_hits (key, kind, at, amount) VALUES ('k', 'message', 1, 1)")
        conn.execute("INSERT INTO no_such_table VALUES (1)")

    first, failed, second, count = await queued_together(
        store,
        store.append_messages(one.id, [Message("user", "first")]),
        store.run_in_db(broken, write=True),
        store.append_messages(two.id, [Message("user", "second")]),
        store.run_in_db(lambda conn: conn.execute("SELECT count(*) FROM messages").fetchone()[0]),
    )
    assert [m.seq for m in first] == [1] and [m.seq for m in second] == [1]
    assert isinstance(failed, StoreError)
    assert count == 2  # a read in the group sees the writes before it
    # Stored once handed back: another connection sees them; the failed job left nothing.
    with sqlite3.connect(db_path) as other:
        assert other.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
        assert other.execute("SELECT count(*) FROM usage_hits").fetchone()[0] == 0


async def test_a_failed_group_commit_fails_every_write_of_it(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, _ = await store.get_or_create_agent("slack:T1:U1", blocks())
    commit = store.commit_group

    def rolled_back_commit() -> None:
        # As after SQLite rolled the group back by itself (disk full, I/O error).
        monkeypatch.setattr(store, "commit_group", commit)  # once
        store._db.execute("ROLLBACK")
        commit()

    monkeypatch.setattr(store, "commit_group", rolled_back_commit)
    outcomes = await queued_together(
        store,
        store.append_messages(one.id, [Message("user", "a")]),
        store.record_usage("k", {"message": 1}, T0),
    )
    assert all(isinstance(outcome, StoreError) for outcome in outcomes)
    assert await store.count_messages(one.id) == 0
