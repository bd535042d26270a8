"""The embedded storage backend: one SQLite file, no server, zero set-up.

Concurrency model: one connection, owned by one worker thread. Every public
method hands a plain function to that thread and awaits it, so the event loop
never blocks on disk and all database access is serialized (which is also what
makes seq assignment and get-or-create race-free inside one process; BEGIN
IMMEDIATE covers a second process on the same file).

The store is a few parts, one mixin class each, all on that one connection
(memory/sqlite/base.py: SQLiteBase, the plumbing): SQLiteAgents
(agents.py: agents, working context, queue state), SQLiteSources (sources.py:
shared collections, loaded documents), SQLiteRecall (recall.py: message
embeddings), SQLiteChannels (channels.py: channel memories),
SQLiteCoordination, SQLiteJournal, SQLiteUsage, and SQLiteStore here (life
cycle, recall and archival storage). Check-in schedules live in the same file
(schedules.py, `store.schedules`); the schema is migrations.py.

Recall search uses FTS5 (bm25), fused with the embeddings of the messages
embedded so far when the caller gives a query vector (memory/sqlite/recall.py).
Archival search is hybrid, FTS5 bm25 fused with embedding similarity (exact
while an archive is small, an ANN index persisted beside the file once large):
see memory/sqlite/search.py.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sqlite3
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from memory.places import Visibility
from memory.search.analysis import query_terms
from memory.search.ann_index import ANN_THRESHOLD
from memory.search.vector_index import embedding_matrix
from memory.sqlite.agents import SQLiteAgents
from memory.sqlite.base import DatabaseWorker, from_ts, to_ts, visible_sql
from memory.sqlite.channels import SQLiteChannels
from memory.sqlite.coordination import SQLiteCoordination
from memory.sqlite.inbox import SQLiteInbox, event_message_seq_in, outbox_insert_in
from memory.sqlite.migrations import MIGRATIONS, migrate
from memory.sqlite.recall import MessageSearch, SQLiteRecall
from memory.sqlite.schedules import SQLiteScheduleStore
from memory.sqlite.search import PassageSearch
from memory.sqlite.sources import SQLiteSources
from memory.sqlite.terms import index_passages
from memory.sqlite.usage import SQLiteUsage
from memory.store import OutboxEntry, Store, StoreError
from memory.types import Message, Passage, SearchPage

_WORD = re.compile(r"\w+")
_MAX_QUERY_TERMS = 32
_F32 = np.dtype("<f4")

_MESSAGE_COLS = (
    "seq, role, content, tool_calls, tool_call_id, name, created_at, event_id, place, speaker, speaker_name, edited_at"
)
_M_MESSAGE_COLS = ", ".join(f"m.{col}" for col in _MESSAGE_COLS.split(", "))
_PASSAGE_COLS = "id, text, source, position, created_at, embedding, place"


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


def _message(row: Sequence[Any]) -> Message:
    return Message(
        seq=row[0],
        role=row[1],
        content=row[2],
        tool_calls=json.loads(row[3]) if row[3] else None,
        tool_call_id=row[4],
        name=row[5],
        created_at=from_ts(row[6]),
        event_id=row[7],
        place=row[8],
        speaker=row[9],
        speaker_name=row[10],
        edited_at=None if row[11] is None else from_ts(row[11]),
    )


def _passage(row: Sequence[Any]) -> Passage:
    return Passage(
        id=row[0],
        text=row[1],
        source=row[2],
        position=row[3],
        created_at=from_ts(row[4]),
        embedding=None if row[5] is None else np.frombuffer(row[5], dtype=_F32).tolist(),
        place=row[6],
    )


class SQLiteStore(
    SQLiteAgents, SQLiteSources, SQLiteRecall, SQLiteChannels, SQLiteCoordination, SQLiteInbox, SQLiteUsage, Store
):
    serves_many_processes = False  # one file, one bot process
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
        super().__init__(path, busy_timeout=busy_timeout)
        # Bounded so that a bot with many users does not keep every archive
        # in RAM; an evicted index is rebuilt from the BLOBs on next search.
        # Only touched from the worker thread.
        self._search = PassageSearch(self.path, max_cached=max_cached_indexes, ann_threshold=ann_threshold)
        self._recall = MessageSearch(max_cached=max_cached_indexes)

    @functools.cached_property
    def schedules(self) -> SQLiteScheduleStore:
        """Check-in schedules, in this file, on this store's connection."""
        return SQLiteScheduleStore(self)

    # -- life cycle --------------------------------------------------------
    async def open(self) -> None:
        if self._worker is None:
            self._worker = DatabaseWorker(f"sqlite {self.path.name}", group=self)
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
        worker, self._worker = self._worker, None
        if worker is None:
            return
        try:
            await worker.run(self._close_sync)
        finally:
            # The close job was the last one queued, so nothing is left to wait for.
            worker.stop()

    def _close_sync(self) -> None:
        self._search.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- recall storage ----------------------------------------------------
    async def append_messages(
        self,
        agent_id: str,
        messages: Sequence[Message],
        *,
        unless_event: str | None = None,
        replies: Sequence[OutboxEntry] = (),
        after: int | None = None,  # the newest seq is read in the write's own transaction anyway
    ) -> list[Message]:
        if not messages and not replies:
            return []
        return await self._call(
            self._append_messages, agent_id, list(messages), unless_event, list(replies), grouping="write"
        )

    def _append_messages(
        self, agent_id: str, messages: list[Message], unless_event: str | None, replies: list[OutboxEntry]
    ) -> list[Message]:
        with self._write() as conn:
            for entry in replies:  # first, as if written before the messages, and in the same transaction
                outbox_insert_in(conn, entry)
            if not messages:
                return []
            # In the same transaction as the append, so the check costs no extra round trip.
            if unless_event is not None and event_message_seq_in(conn, agent_id, unless_event) is not None:
                return []
            (last,) = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM messages WHERE agent_id = ?", (agent_id,)
            ).fetchone()
            indexed = 0
            for n, m in enumerate(messages, 1):
                rowid = conn.execute(
                    "INSERT INTO messages (agent_id, seq, role, content, tool_calls, tool_call_id, name,"
                    " created_at, event_id, place, speaker, speaker_name, edited_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        agent_id,
                        last + n,
                        m.role,
                        m.content,
                        m.tool_calls_json(),
                        m.tool_call_id,
                        m.name,
                        to_ts(m.created_at),
                        m.event_id,
                        m.place,
                        m.speaker,
                        m.speaker_name,
                        None if m.edited_at is None else to_ts(m.edited_at),
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

    async def messages_since(self, agent_id: str, seq: int, *, place: str | None = None) -> list[Message]:
        if place is None:
            sql = f"SELECT {_MESSAGE_COLS} FROM messages WHERE agent_id = ? AND seq >= ? ORDER BY seq"
            return [_message(row) for row in await self._rows(sql, agent_id, seq)]
        sql = f"SELECT {_MESSAGE_COLS} FROM messages WHERE agent_id = ? AND place = ? AND seq >= ? ORDER BY seq"
        return [_message(row) for row in await self._rows(sql, agent_id, place, seq)]

    async def count_messages(self, agent_id: str, *, visible: Visibility | None = None) -> int:
        where, args = visible_sql(visible)
        if where:
            sql = f"SELECT count(*) FROM messages WHERE agent_id = ?{where}"
            return int((await self._rows(sql, agent_id, *args))[0][0])
        # Rows, not the last seq: a selective forget leaves gaps. The count
        # walks the agent's entries of the (agent_id, seq) key only.
        sql = "SELECT count(*) FROM messages WHERE agent_id = ?"
        return int((await self._rows(sql, agent_id))[0][0])

    async def search_messages(
        self,
        agent_id: str,
        query: str,
        limit: int,
        offset: int = 0,
        *,
        query_vector: Sequence[float] | None = None,
        visible: Visibility | None = None,
    ) -> SearchPage:
        if query_vector is not None or query_terms(query):
            # Keywords alone too are conversation search's ranking (stemmed, stop words out).
            return await self._hybrid_messages(agent_id, query, query_vector, limit, offset, visible)
        # A query of stop words only ("what was it?"): their plain FTS5 matches.
        terms = fts_terms(query)
        if terms is None:
            return SearchPage(items=[], total=0)
        agent = agent_id.replace('"', '""')
        match = f'agent_id : "{agent}" AND text : ({terms})'
        if visible is not None and not visible.everything:
            return await self._call(self._search_visible_messages, agent_id, match, limit, offset, visible)
        return await self._call(self._search_messages, agent_id, match, limit, offset)

    def _search_visible_messages(
        self, agent_id: str, match: str, limit: int, offset: int, visible: Visibility
    ) -> SearchPage:
        """Keyword search of the messages `visible` sees: the filter is applied
        to every FTS hit before ranking and paging, so neither a page nor the
        total counts an invisible message. CROSS JOIN keeps FTS5 the outer
        loop (one MATCH, then a rowid probe per hit)."""
        conn = self._db
        where, args = visible_sql(visible, "m.place")
        hits = (
            "FROM messages_fts f CROSS JOIN messages m ON m.id = f.rowid"
            f" WHERE messages_fts MATCH ? AND m.agent_id = ?{where}"
        )
        (total,) = conn.execute(f"SELECT count(*) {hits}", (match, agent_id, *args)).fetchone()
        rows = conn.execute(
            f"SELECT {_M_MESSAGE_COLS} {hits} ORDER BY bm25(messages_fts, 0.0, 1.0), f.rowid LIMIT ? OFFSET ?",
            (match, agent_id, *args, limit, offset),
        )
        return SearchPage(items=[_message(row) for row in rows], total=total)

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
        self,
        agent_id: str,
        start: datetime,
        end: datetime,
        limit: int,
        offset: int = 0,
        *,
        visible: Visibility | None = None,
    ) -> SearchPage:
        return await self._call(self._messages_between, agent_id, to_ts(start), to_ts(end), limit, offset, visible)

    def _messages_between(
        self, agent_id: str, start: float, end: float, limit: int, offset: int, visible: Visibility | None
    ) -> SearchPage:
        conn = self._db
        filtered, places = visible_sql(visible)
        where = f"WHERE agent_id = ? AND created_at >= ? AND created_at < ?{filtered}"
        args = (agent_id, start, end, *places)
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
                "INSERT INTO passages (agent_id, text, source, position, created_at, embedding, place)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)"
            )
            ids: list[int] = []
            for n, p in enumerate(passages):
                values = (agent_id, p.text, p.source, p.position, to_ts(p.created_at), blobs.get(n), p.place)
                cursor = conn.execute(sql, values)
                assert cursor.lastrowid is not None  # an INSERT always sets it
                ids.append(cursor.lastrowid)
            index_passages(conn, [(passage_id, agent_id, p.text) for passage_id, p in zip(ids, passages, strict=True)])
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
        *,
        visible: Visibility | None = None,
    ) -> SearchPage:
        query = np.asarray(query_vector, dtype=_F32)
        return await self._call(self._search_passages, agent_id, query_text, query, limit, offset, visible)

    def _search_passages(
        self,
        agent_id: str,
        text: str,
        query: npt.NDArray[np.float32],
        limit: int,
        offset: int,
        visible: Visibility | None,
    ) -> SearchPage:
        hits, total = self._search.search(self._db, agent_id, text, query, limit, offset, visible=visible)
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

    async def list_passages(
        self, agent_id: str, limit: int, offset: int = 0, *, visible: Visibility | None = None
    ) -> list[Passage]:
        where, args = visible_sql(visible)
        sql = f"SELECT {_PASSAGE_COLS} FROM passages WHERE agent_id = ?{where}"
        sql += " ORDER BY created_at, id LIMIT ? OFFSET ?"
        return [_passage(row) for row in await self._rows(sql, agent_id, *args, limit, offset)]

    async def count_passages(self, agent_id: str, *, visible: Visibility | None = None) -> int:
        where, args = visible_sql(visible)
        sql = f"SELECT count(*) FROM passages WHERE agent_id = ?{where}"
        return int((await self._rows(sql, agent_id, *args))[0][0])

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
        if self._search.ann_path(agent_id).exists():
            # An ANN file may keep a removed vector's bytes: dropped, rebuilt from the rows left.
            self._search.forget(agent_id)
