"""The embedded storage backend: one SQLite file, no server, zero set-up.

Concurrency model: one connection, owned by one worker thread. Every public
method hands a plain function to that thread and awaits it, so the event loop
never blocks on disk and all database access is serialized (which is also what
makes seq assignment and get-or-create race-free inside one process; BEGIN
IMMEDIATE covers a second process on the same file).

Recall search uses FTS5 (bm25), fused with the embeddings of the messages
embedded so far when the caller gives a query vector (memory/sqlite/recall.py).
Archival search is hybrid, FTS5 bm25 fused with embedding similarity (exact
while an archive is small, an ANN index persisted beside the file once large):
see memory/sqlite/search.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sqlite3
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from memory.search.ann_index import ANN_THRESHOLD
from memory.search.vector_index import embedding_matrix
from memory.sqlite.coordination import SQLiteCoordination
from memory.sqlite.journal import SQLiteJournal
from memory.sqlite.migrations import MIGRATIONS, migrate
from memory.sqlite.recall import MessageSearch, SQLiteRecall
from memory.sqlite.search import PassageSearch
from memory.sqlite.usage import SQLiteUsage
from memory.store import DocumentRecord, SourceRecord, Store, StoreError, source_key
from memory.types import AgentRecord, Block, Message, Passage, SearchPage

T = TypeVar("T")
log = logging.getLogger(__name__)

_WORD = re.compile(r"\w+")
_MAX_QUERY_TERMS = 32
_F32 = np.dtype("<f4")

_AGENT_COLS = "id, key, created_at, summary, queue_start_seq, summary_updated_at"
_MESSAGE_COLS = "seq, role, content, tool_calls, tool_call_id, name, created_at, event_id"
_M_MESSAGE_COLS = ", ".join(f"m.{col}" for col in _MESSAGE_COLS.split(", "))
_PASSAGE_COLS = "id, text, source, position, created_at, embedding"
_BLOCKS_SQL = 'SELECT label, value, "limit", updated_at FROM blocks WHERE agent_id = ? ORDER BY position'


def _ts(moment: datetime) -> float:
    # A naive datetime is taken as UTC, never as the server's local time.
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def fts_terms(text: str) -> str | None:
    """Arbitrary user text as a safe FTS5 expression: every word quoted, OR-ed.

    Quoting turns operators (AND, NEAR, *, -, :) into plain words, and keeping
    only \\w runs drops quotes and punctuation, so no input can raise a syntax
    error. OR (not AND) lets bm25 rank partial matches below fuller ones.
    Returns None when nothing searchable is left.
    """
    words = dict.fromkeys(_WORD.findall(unicodedata.normalize("NFC", text)))
    if not words:
        return None
    return " OR ".join(f'"{word}"' for word in list(words)[:_MAX_QUERY_TERMS])


def _agent(row: Sequence[Any]) -> AgentRecord:
    # _AGENT_COLS lists the columns in the dataclass field order.
    summary_at = None if row[5] is None else _dt(row[5])
    return AgentRecord(row[0], row[1], _dt(row[2]), row[3], row[4], summary_at)


def _block(row: Sequence[Any]) -> Block:
    return Block(label=row[0], value=row[1], limit=row[2], updated_at=_dt(row[3]))


def _message(row: Sequence[Any]) -> Message:
    return Message(
        seq=row[0],
        role=row[1],
        content=row[2],
        tool_calls=json.loads(row[3]) if row[3] else None,
        tool_call_id=row[4],
        name=row[5],
        created_at=_dt(row[6]),
        event_id=row[7],
    )


def _passage(row: Sequence[Any]) -> Passage:
    return Passage(
        id=row[0],
        text=row[1],
        source=row[2],
        position=row[3],
        created_at=_dt(row[4]),
        embedding=None if row[5] is None else np.frombuffer(row[5], dtype=_F32).tolist(),
    )


class SQLiteStore(SQLiteRecall, SQLiteCoordination, SQLiteJournal, SQLiteUsage, Store):
    _message_columns = _MESSAGE_COLS
    _message_of = staticmethod(_message)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        max_cached_indexes: int = 256,
        ann_threshold: int = ANN_THRESHOLD,
    ) -> None:
        self.path = Path(path)
        self._busy_timeout = busy_timeout
        # Bounded so that a bot with many users does not keep every archive
        # in RAM; an evicted index is rebuilt from the BLOBs on next search.
        self._executor: ThreadPoolExecutor | None = None
        # The fields below are only touched from the worker thread.
        self._conn: sqlite3.Connection | None = None
        self._search = PassageSearch(self.path, max_cached=max_cached_indexes, ann_threshold=ann_threshold)
        self._recall = MessageSearch(max_cached=max_cached_indexes)

    # -- plumbing ----------------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        executor = self._executor
        if executor is None:
            raise StoreError(f"SQLite store {self.path} is not open")
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite store {self.path}: {exc}") from exc

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"SQLite store {self.path} is not open")
        return self._conn

    def _fetch(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        return self._db.execute(sql, args).fetchall()

    async def _rows(self, sql: str, *args: Any) -> list[Any]:
        """A plain read; rows are turned into records back on the event loop."""
        return await self._call(self._fetch, sql, args)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; IMMEDIATE so read-then-write cannot race
        another process between the read and the write."""
        conn = self._db
        conn.execute("BEGIN IMMEDIATE")
        with conn:
            yield conn

    # -- life cycle --------------------------------------------------------
    async def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        try:
            await self._call(self._open_sync)
        except BaseException:
            await self.close()  # no worker thread left behind by a failed open
            raise

    def _open_sync(self) -> None:
        if self._conn is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the folder for SQLite store {self.path}: {exc}") from exc
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout,
            isolation_level=None,  # transactions are explicit, see _write
            check_same_thread=False,
            cached_statements=256,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable across application crashes in WAL mode; only a
            # power loss can drop the last commits, which is fine for chat memory.
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            # Deleted content is overwritten, so "forget me" is not undone by
            # reading free pages of the file.
            conn.execute("PRAGMA secure_delete = ON")
            migrate(conn, MIGRATIONS)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_sync)
        finally:
            # The close job was the last one queued, so nothing is left to wait for.
            executor.shutdown(wait=False)

    def _close_sync(self) -> None:
        self._search.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- agents ------------------------------------------------------------
    async def get_or_create_agent(self, key: str, default_blocks: Sequence[Block]) -> tuple[AgentRecord, list[Block]]:
        return await self._call(self._get_or_create_agent, key, list(default_blocks))

    def _get_or_create_agent(self, key: str, default_blocks: list[Block]) -> tuple[AgentRecord, list[Block]]:
        now = time.time()
        with self._write() as conn:
            created = conn.execute(
                "INSERT INTO agents (id, key, created_at) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (uuid.uuid4().hex, key, now),
            ).rowcount
            row = conn.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE key = ?", (key,)).fetchone()
            if created:
                conn.executemany(
                    'INSERT INTO blocks (agent_id, label, value, "limit", updated_at, position)'
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [(row[0], b.label, b.value, b.limit, now, n) for n, b in enumerate(default_blocks, 1)],
                )
            blocks = [_block(r) for r in conn.execute(_BLOCKS_SQL, (row[0],))]
        return _agent(row), blocks

    async def find_agent(self, key: str) -> AgentRecord | None:
        rows = await self._rows(f"SELECT {_AGENT_COLS} FROM agents WHERE key = ?", key)
        return _agent(rows[0]) if rows else None

    async def list_agents(self) -> list[AgentRecord]:
        sql = f"SELECT {_AGENT_COLS} FROM agents ORDER BY created_at, rowid"
        return [_agent(row) for row in await self._rows(sql)]

    async def delete_agent(self, agent_id: str) -> None:
        await self._call(self._delete_agent, agent_id)

    def _delete_agent(self, agent_id: str) -> None:
        with self._write() as conn:
            had_messages = conn.execute("SELECT 1 FROM messages WHERE agent_id = ? LIMIT 1", (agent_id,)).fetchone()
            had_passages = conn.execute("SELECT 1 FROM passages WHERE agent_id = ? LIMIT 1", (agent_id,)).fetchone()
            # Cascades to blocks, messages (whose trigger empties the FTS rows)
            # and passages.
            conn.execute("DELETE FROM agents WHERE id = ?", (agent_id,))
            if had_messages:
                # FTS5 before 3.44 keeps deleted terms in its segments until they
                # are merged; 'optimize' merges everything, so the words are gone
                # for real. Costs one index rewrite, acceptable for a rare call.
                conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
            if had_passages:
                conn.execute("INSERT INTO passages_fts (passages_fts) VALUES ('optimize')")
        self._search.forget(agent_id)
        self._recall.forget(agent_id)

    async def flush_deleted(self) -> None:
        await self._call(self._flush_deleted)

    def _flush_deleted(self) -> None:
        # The WAL still holds the pages as they were before the delete, and a
        # checkpoint alone leaves them there until overwritten: TRUNCATE copies
        # the new (secure_delete-zeroed) pages into the file and empties the WAL.
        busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:  # another process reads an old snapshot: the old pages stay in the WAL until it is reused
            log.warning("SQLite store %s: the WAL could not be emptied after a forget (a reader is busy)", self.path)

    # -- working context ---------------------------------------------------
    async def load_blocks(self, agent_id: str) -> list[Block]:
        return [_block(row) for row in await self._rows(_BLOCKS_SQL, agent_id)]

    async def save_block(self, agent_id: str, block: Block) -> None:
        await self._call(self._save_block, agent_id, block)

    def _save_block(self, agent_id: str, block: Block) -> None:
        with self._write() as conn:
            # A new label goes last; an existing one keeps its place.
            conn.execute(
                'INSERT INTO blocks (agent_id, label, value, "limit", updated_at, position)'
                " VALUES (?, ?, ?, ?, ?,"
                " (SELECT coalesce(max(position), 0) + 1 FROM blocks WHERE agent_id = ?))"
                " ON CONFLICT (agent_id, label) DO UPDATE SET value = excluded.value,"
                ' "limit" = excluded."limit", updated_at = excluded.updated_at',
                (agent_id, block.label, block.value, block.limit, _ts(block.updated_at), agent_id),
            )

    # -- FIFO queue state --------------------------------------------------
    async def update_queue(
        self, agent_id: str, summary: str, queue_start_seq: int, summary_updated_at: datetime
    ) -> None:
        await self._call(self._update_queue, agent_id, summary, queue_start_seq, _ts(summary_updated_at))

    def _update_queue(self, agent_id: str, summary: str, start: int, updated: float) -> None:
        with self._write() as conn:
            changed = conn.execute(
                "UPDATE agents SET summary = ?, queue_start_seq = ?, summary_updated_at = ? WHERE id = ?",
                (summary, start, updated, agent_id),
            ).rowcount
        if not changed:
            raise StoreError(f"SQLite store {self.path}: no agent {agent_id!r}")

    # -- recall storage ----------------------------------------------------
    async def append_messages(self, agent_id: str, messages: Sequence[Message]) -> list[Message]:
        if not messages:
            return []
        return await self._call(self._append_messages, agent_id, list(messages))

    def _append_messages(self, agent_id: str, messages: list[Message]) -> list[Message]:
        with self._write() as conn:
            (last,) = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM messages WHERE agent_id = ?", (agent_id,)
            ).fetchone()
            indexed = 0
            for n, m in enumerate(messages, 1):
                rowid = conn.execute(
                    "INSERT INTO messages (agent_id, seq, role, content, tool_calls,"
                    " tool_call_id, name, created_at, event_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        agent_id,
                        last + n,
                        m.role,
                        m.content,
                        m.tool_calls_json(),
                        m.tool_call_id,
                        m.name,
                        _ts(m.created_at),
                        m.event_id,
                    ),
                ).lastrowid
                text = m.searchable_text()
                if text:
                    conn.execute(
                        "INSERT INTO messages_fts (rowid, agent_id, text) VALUES (?, ?, ?)",
                        (rowid, agent_id, text),
                    )
                    indexed += 1
        self._recall.rows_inserted(indexed)
        # Only after the commit, so a failed append leaves the objects untouched.
        for n, m in enumerate(messages, 1):
            m.seq = last + n
        return messages

    async def messages_since(self, agent_id: str, seq: int) -> list[Message]:
        sql = f"SELECT {_MESSAGE_COLS} FROM messages WHERE agent_id = ? AND seq >= ? ORDER BY seq"
        return [_message(row) for row in await self._rows(sql, agent_id, seq)]

    async def count_messages(self, agent_id: str) -> int:
        # Seqs are gap-free 1..N and messages are never deleted one by one, so
        # max(seq) is the count: one index probe instead of a scan that grows
        # with the history (this runs for the memory status line every step).
        sql = "SELECT coalesce(max(seq), 0) FROM messages WHERE agent_id = ?"
        return int((await self._rows(sql, agent_id))[0][0])

    async def search_messages(
        self, agent_id: str, query: str, limit: int, offset: int = 0, *, query_vector: Sequence[float] | None = None
    ) -> SearchPage:
        if query_vector is not None:
            return await self._hybrid_messages(agent_id, query, query_vector, limit, offset)
        terms = fts_terms(query)
        if terms is None:
            return SearchPage(items=[], total=0)
        agent = agent_id.replace('"', '""')
        match = f'agent_id : "{agent}" AND text : ({terms})'
        return await self._call(self._search_messages, agent_id, match, limit, offset)

    def _search_messages(self, agent_id: str, match: str, limit: int, offset: int) -> SearchPage:
        conn = self._db
        (total,) = conn.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (match,)).fetchone()
        # Rank and page inside FTS first, then fetch the page's rows: joining
        # first lets the planner drive from messages and run one FTS query per
        # message. The agent_id column is weighted 0 so it never affects
        # relevance; the outer m.agent_id test is a second fence around it.
        rows = conn.execute(
            f"SELECT {_M_MESSAGE_COLS} FROM ("
            "  SELECT rowid AS id, bm25(messages_fts, 0.0, 1.0) AS score FROM messages_fts"
            "  WHERE messages_fts MATCH ? ORDER BY score, rowid LIMIT ? OFFSET ?"
            ") AS hit JOIN messages m ON m.id = hit.id WHERE m.agent_id = ?"
            " ORDER BY hit.score, hit.id",
            (match, limit, offset, agent_id),
        )
        return SearchPage(items=[_message(row) for row in rows], total=total)

    async def messages_between(
        self, agent_id: str, start: datetime, end: datetime, limit: int, offset: int = 0
    ) -> SearchPage:
        return await self._call(self._messages_between, agent_id, _ts(start), _ts(end), limit, offset)

    def _messages_between(self, agent_id: str, start: float, end: float, limit: int, offset: int) -> SearchPage:
        conn = self._db
        where = "WHERE agent_id = ? AND created_at >= ? AND created_at < ?"
        args = (agent_id, start, end)
        (total,) = conn.execute(f"SELECT count(*) FROM messages {where}", args).fetchone()
        rows = conn.execute(
            f"SELECT {_MESSAGE_COLS} FROM messages {where} ORDER BY created_at, seq LIMIT ? OFFSET ?",
            (*args, limit, offset),
        )
        return SearchPage(items=[_message(row) for row in rows], total=total)

    # -- archival storage --------------------------------------------------
    async def insert_passages(self, agent_id: str, passages: Sequence[Passage]) -> list[int]:
        if not passages:
            return []
        ids = await self._call(self._insert_passages, agent_id, list(passages))
        for passage, new_id in zip(passages, ids, strict=True):
            passage.id = new_id
        return ids

    def _insert_passages(self, agent_id: str, passages: list[Passage]) -> list[int]:
        embedded = [n for n, p in enumerate(passages) if p.embedding is not None]
        with self._write() as conn:
            matrix = self._checked_vectors(conn, agent_id, [passages[n].embedding or [] for n in embedded])
            blobs: dict[int, bytes] = {n: matrix[i].tobytes() for i, n in enumerate(embedded)}
            sql = (
                "INSERT INTO passages (agent_id, text, source, position, created_at, embedding)"
                " VALUES (?, ?, ?, ?, ?, ?)"
            )
            ids: list[int] = []
            for n, p in enumerate(passages):
                cursor = conn.execute(sql, (agent_id, p.text, p.source, p.position, _ts(p.created_at), blobs.get(n)))
                assert cursor.lastrowid is not None  # an INSERT always sets it
                ids.append(cursor.lastrowid)
        self._search.rows_inserted(len(ids))
        if embedded:
            self._search.added(agent_id, [ids[n] for n in embedded], matrix)
        return ids

    async def set_embeddings(self, agent_id: str, vectors: dict[int, list[float]]) -> None:
        if vectors:
            await self._call(self._set_embeddings, agent_id, dict(vectors))

    def _set_embeddings(self, agent_id: str, vectors: dict[int, list[float]]) -> None:
        ids = list(vectors)
        with self._write() as conn:
            matrix = self._checked_vectors(conn, agent_id, [vectors[i] for i in ids])
            # The agent_id condition is what keeps one agent from writing
            # another agent's passages; rowcount tells us which ids were ours.
            updated = [
                n
                for n, passage_id in enumerate(ids)
                if conn.execute(
                    "UPDATE passages SET embedding = ? WHERE id = ? AND agent_id = ?",
                    (matrix[n].tobytes(), passage_id, agent_id),
                ).rowcount
            ]
        if updated:
            self._search.added(agent_id, [ids[n] for n in updated], matrix[updated])

    def _checked_vectors(
        self, conn: sqlite3.Connection, agent_id: str, vectors: list[list[float]]
    ) -> npt.NDArray[np.float32]:
        """Vectors as a float32 matrix, refused (ValueError) before anything is
        written if their length differs from the agent's stored embeddings."""
        return embedding_matrix(vectors, self._search.dim(conn, agent_id) if vectors else None)

    async def passages_without_embedding(self, agent_id: str) -> list[Passage]:
        sql = f"SELECT {_PASSAGE_COLS} FROM passages WHERE agent_id = ? AND embedding IS NULL"
        return [_passage(row) for row in await self._rows(sql + " ORDER BY id", agent_id)]

    async def search_passages(
        self,
        agent_id: str,
        query_text: str,
        query_vector: Sequence[float],
        limit: int,
        offset: int = 0,
    ) -> SearchPage:
        query = np.asarray(query_vector, dtype=_F32)
        return await self._call(self._search_passages, agent_id, query_text, query, limit, offset)

    def _search_passages(
        self, agent_id: str, text: str, query: npt.NDArray[np.float32], limit: int, offset: int
    ) -> SearchPage:
        hits, total = self._search.search(self._db, agent_id, text, query, limit, offset)
        if not hits:
            return SearchPage(items=[], total=total)
        rows = self._db.execute(
            f"SELECT {_PASSAGE_COLS} FROM passages WHERE id IN (SELECT value FROM json_each(?)) AND agent_id = ?",
            (json.dumps([passage_id for passage_id, _ in hits]), agent_id),
        )
        by_id = {row[0]: row for row in rows}
        items = [(_passage(by_id[pid]), score) for pid, score in hits if pid in by_id]
        return SearchPage(items=items, total=total)

    @property
    def _indexes(self) -> Mapping[str, object]:
        """The agents whose vectors are held in memory now (tests look at it)."""
        return self._search.cached_agents

    async def wait_for_search_indexes(self) -> None:
        """Until background ANN builds are done and in use (tests, benches)."""
        await self._call(self._search.wait_for_builds)

    async def list_passages(self, agent_id: str, limit: int, offset: int = 0) -> list[Passage]:
        sql = f"SELECT {_PASSAGE_COLS} FROM passages WHERE agent_id = ?"
        sql += " ORDER BY created_at, id LIMIT ? OFFSET ?"
        return [_passage(row) for row in await self._rows(sql, agent_id, limit, offset)]

    async def count_passages(self, agent_id: str) -> int:
        sql = "SELECT count(*) FROM passages WHERE agent_id = ?"
        return int((await self._rows(sql, agent_id))[0][0])

    async def delete_passages(self, agent_id: str, ids: Sequence[int]) -> None:
        if ids:
            await self._call(self._delete_passages, agent_id, [int(i) for i in ids])

    def _delete_passages(self, agent_id: str, ids: list[int]) -> None:
        with self._write() as conn:
            deleted = conn.execute(
                "DELETE FROM passages WHERE agent_id = ? AND id IN (SELECT value FROM json_each(?))",
                (agent_id, json.dumps(ids)),
            ).rowcount
        self._search.removed(agent_id, ids, deleted)

    # -- other modules' tables in this file ----------------------------------
    async def run_in_db(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = False) -> T:
        """Run `fn(connection)` on this store's worker thread, inside one write
        transaction if `write`. For modules that keep their own tables in this
        database (check-in schedules) and must share its connection and order."""

        def job() -> T:
            if not write:
                return fn(self._db)
            with self._write() as conn:
                return fn(conn)

        return await self._call(job)

    # -- shared collections ------------------------------------------------
    async def create_source(self, name: str) -> tuple[SourceRecord, bool]:
        return await self._call(self._create_source, name)

    def _create_source(self, name: str) -> tuple[SourceRecord, bool]:
        now, key = time.time(), source_key(name)
        with self._write() as conn:
            conn.execute(
                "INSERT INTO agents (id, key, created_at) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (uuid.uuid4().hex, key, now),
            )
            (agent_id,) = conn.execute("SELECT id FROM agents WHERE key = ?", (key,)).fetchone()
            created = conn.execute(
                "INSERT INTO sources (agent_id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (agent_id, name, now),
            ).rowcount
            row = conn.execute(f"SELECT {_SOURCE_COLS} FROM sources WHERE agent_id = ?", (agent_id,)).fetchone()
        return _source(row), bool(created)

    async def find_source(self, name: str) -> SourceRecord | None:
        rows = await self._rows(f"SELECT {_SOURCE_COLS} FROM sources WHERE name = ?", name)
        return _source(rows[0]) if rows else None

    async def list_sources(self) -> list[SourceRecord]:
        return [_source(row) for row in await self._rows(f"SELECT {_SOURCE_COLS} FROM sources ORDER BY name")]

    async def attach_source(self, source_id: str, agent_id: str | None) -> None:
        await self._call(self._set_attachment, source_id, agent_id, True)

    async def detach_source(self, source_id: str, agent_id: str | None) -> None:
        await self._call(self._set_attachment, source_id, agent_id, False)

    def _set_attachment(self, source_id: str, agent_id: str | None, attached: bool) -> None:
        with self._write() as conn:
            if agent_id is None:
                conn.execute("UPDATE sources SET attach_all = ? WHERE agent_id = ?", (int(attached), source_id))
                # Attaching to all clears earlier detaches; detaching from all clears everything.
                cleared = "attached = 0" if attached else "1"
                conn.execute(f"DELETE FROM source_attachments WHERE source_id = ? AND {cleared}", (source_id,))
            else:
                conn.execute(
                    "INSERT INTO source_attachments (agent_id, source_id, attached) VALUES (?, ?, ?)"
                    " ON CONFLICT (agent_id, source_id) DO UPDATE SET attached = excluded.attached",
                    (agent_id, source_id, int(attached)),
                )

    async def attached_sources(self, agent_id: str) -> list[SourceRecord]:
        cols = ", ".join(f"s.{col}" for col in _SOURCE_COLS.split(", "))
        sql = (
            f"SELECT {cols} FROM sources s LEFT JOIN source_attachments a"
            " ON a.source_id = s.agent_id AND a.agent_id = ?"
            " WHERE s.agent_id != ? AND (a.attached = 1 OR (s.attach_all = 1 AND a.attached IS NULL))"
            " ORDER BY s.name"
        )
        return [_source(row) for row in await self._rows(sql, agent_id, agent_id)]

    async def source_attachments(self, source_id: str) -> list[str]:
        sql = "SELECT agent_id FROM source_attachments WHERE source_id = ? AND attached = 1 ORDER BY agent_id"
        return [row[0] for row in await self._rows(sql, source_id)]

    # -- loaded documents ----------------------------------------------------
    async def record_document(self, agent_id: str, document: DocumentRecord) -> None:
        await self._call(self._record_document, agent_id, document)

    def _record_document(self, agent_id: str, document: DocumentRecord) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO documents (agent_id, sha256, name, passages, loaded_at) VALUES (?, ?, ?, ?, ?)",
                (agent_id, document.sha256, document.name, document.passages, _ts(document.loaded_at)),
            )

    async def list_documents(self, agent_id: str) -> list[DocumentRecord]:
        sql = "SELECT sha256, name, passages, loaded_at FROM documents WHERE agent_id = ? ORDER BY loaded_at, name"
        return [DocumentRecord(row[0], row[1], row[2], _dt(row[3])) for row in await self._rows(sql, agent_id)]

    async def known_passage_hashes(self, agent_id: str, hashes: Sequence[str]) -> set[str]:
        if not hashes:
            return set()
        return await self._call(self._known_hashes, agent_id, list(hashes))

    def _known_hashes(self, agent_id: str, hashes: list[str]) -> set[str]:
        rows = self._db.execute(
            "SELECT hash FROM passage_hashes WHERE agent_id = ? AND hash IN (SELECT value FROM json_each(?))",
            (agent_id, json.dumps(hashes)),
        )
        return {row[0] for row in rows}

    async def insert_hashed_passages(
        self, agent_id: str, passages: Sequence[Passage], hashes: Sequence[str]
    ) -> list[int]:
        if len(passages) != len(hashes):
            raise ValueError(f"{len(passages)} passages but {len(hashes)} hashes")
        if not passages:
            return []
        ids = await self._call(self._insert_hashed, agent_id, list(passages), list(hashes))
        for passage, new_id in zip(passages, ids, strict=True):
            if new_id:
                passage.id = new_id
        return ids

    def _insert_hashed(self, agent_id: str, passages: list[Passage], hashes: list[str]) -> list[int]:
        # One job on the store thread: no other call (another load of the same
        # agent in this process) can slip between the check and the insert, and
        # a cancelled caller cannot stop it between passages and their hashes.
        seen = self._known_hashes(agent_id, hashes)
        keep: list[int] = []
        for n, content_hash in enumerate(hashes):
            if content_hash not in seen:
                seen.add(content_hash)
                keep.append(n)
        ids = [0] * len(passages)
        if not keep:
            return ids
        new_ids = self._insert_passages(agent_id, [passages[n] for n in keep])
        with self._write() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO passage_hashes (agent_id, hash, passage_id) VALUES (?, ?, ?)",
                [(agent_id, hashes[n], new_id) for n, new_id in zip(keep, new_ids, strict=True)],
            )
        for n, new_id in zip(keep, new_ids, strict=True):
            ids[n] = new_id
        return ids


_SOURCE_COLS = "agent_id, name, created_at, attach_all"


def _source(row: Sequence[Any]) -> SourceRecord:
    return SourceRecord(id=row[0], name=row[1], created_at=_dt(row[2]), attach_all=bool(row[3]))
