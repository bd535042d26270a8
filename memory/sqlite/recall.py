"""Recall search for the SQLite store: conversation search ranking
(memory/search/conversation.py) over the agent's messages and the embeddings
of those that have one.

Messages are embedded lazily (memory/recall.py), so an agent's history is in
part embedded and in part not; a message without a vector is ranked by its
other signals (keywords, context, speaker, time). Each agent's messages are
held in an LRU-bounded cache of ConversationIndexes, read from the database on
first search and brought up to date on every search (messages with a higher
seq, vectors the index lacks), so what another process wrote is seen too.

Everything here runs on the store's worker thread (the one owning the
connection). The FTS5 table still serves keyword-only search
(Store.search_messages without a query vector).
"""

from __future__ import annotations

import json
import sqlite3
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from cachetools import LRUCache

from memory.places import Visibility
from memory.search.conversation import ConversationIndex
from memory.search.vector_index import check_dimension, embedding_matrix
from memory.sqlite.base import SQLiteBase
from memory.sqlite.search import CachedRowCount
from memory.types import Message, SearchPage

_F32 = np.dtype("<f4")

# Vectors of at most this many turns (the newest lacking one) are looked up
# per search, to pick up what another process embedded.
REFRESH_LIMIT = 512

# What is embedded: people's and the agent's own words. Tool results and
# system alerts (stored as role user, name system_alert) are left to keyword
# search. Must match the partial index messages_unembedded
# (memory/sqlite/migrations.py) term for term, for the backlog query to use it.
PENDING_WHERE = (
    "embedding IS NULL AND role IN ('user', 'assistant') AND content <> '' AND coalesce(name, '') <> 'system_alert'"
)


class SQLiteRecall(SQLiteBase):
    """SQLiteStore's lazily embedded recall: the backlog, storing vectors and
    the hybrid search (a mixin of SQLiteStore, on its worker thread)."""

    _recall: MessageSearch
    _message_columns: str

    @staticmethod
    @abstractmethod
    def _message_of(row: Sequence[Any]) -> Message: ...

    async def messages_without_embedding(self, agent_id: str, limit: int) -> list[Message]:
        if limit <= 0:
            return []
        sql = (
            f"SELECT {self._message_columns} FROM messages WHERE agent_id = ? AND {PENDING_WHERE}"
            " ORDER BY seq DESC LIMIT ?"
        )
        rows = await self.run_in_db(lambda conn: conn.execute(sql, (agent_id, limit)).fetchall())
        return [self._message_of(row) for row in rows]

    async def set_message_embeddings(self, agent_id: str, vectors: Mapping[int, Sequence[float]]) -> None:
        if not vectors:
            return
        seqs = [int(seq) for seq in vectors]
        matrix = embedding_matrix([vectors[seq] for seq in vectors])

        def write(conn: sqlite3.Connection) -> list[int]:
            check_dimension(matrix, self._recall.dim(conn, agent_id))
            # The agent_id condition keeps one agent from writing another's
            # messages; rowcount tells which seqs were the agent's.
            return [
                n
                for n, seq in enumerate(seqs)
                if conn.execute(
                    "UPDATE messages SET embedding = ? WHERE agent_id = ? AND seq = ?",
                    (matrix[n].tobytes(), agent_id, seq),
                ).rowcount
            ]

        updated = await self.run_in_db(write, write=True)
        if updated:
            # After the commit, and on the worker thread that owns the cache.
            await self.run_in_db(lambda _: self._recall.added(agent_id, [seqs[n] for n in updated], matrix[updated]))

    async def delete_messages(self, agent_id: str, seqs: Sequence[int]) -> int:
        if not seqs:
            return 0
        wanted = json.dumps(sorted({int(seq) for seq in seqs}))

        def delete(conn: sqlite3.Connection) -> int:
            # The FTS row goes with its message (trigger messages_fts_delete), the embedding is in the row.
            return conn.execute(
                "DELETE FROM messages WHERE agent_id = ? AND seq IN (SELECT value FROM json_each(?))",
                (agent_id, wanted),
            ).rowcount

        deleted = await self.run_in_db(delete, write=True)
        # The in-memory index only ever appends: rebuilt from what is left on the next search.
        await self.run_in_db(lambda _: self._recall.forget(agent_id))
        return int(deleted)

    async def _hybrid_messages(
        self,
        agent_id: str,
        query: str,
        query_vector: Sequence[float] | None,
        limit: int,
        offset: int,
        visible: Visibility | None = None,
    ) -> SearchPage:
        vector = None if query_vector is None else np.asarray(query_vector, dtype=_F32)

        def search(conn: sqlite3.Connection) -> tuple[list[Any], list[int], int]:
            seqs, total = self._recall.search(conn, agent_id, query, vector, limit, max(offset, 0), visible)
            if not seqs:
                return [], seqs, total
            rows = conn.execute(
                f"SELECT {self._message_columns} FROM messages"
                " WHERE agent_id = ? AND seq IN (SELECT value FROM json_each(?))",
                (agent_id, json.dumps(seqs)),
            ).fetchall()
            return rows, seqs, total

        rows, seqs, total = await self.run_in_db(search)
        by_seq = {message.seq: message for message in map(self._message_of, rows)}
        return SearchPage(items=[by_seq[seq] for seq in seqs if seq in by_seq], total=total)


class MessageSearch:
    """Per-agent ConversationIndexes (a bounded cache) and the recall ranking."""

    def __init__(self, *, max_cached: int = 256) -> None:
        self._cache: LRUCache[str, ConversationIndex] = LRUCache(max(max_cached, 1))
        self.row_count = CachedRowCount("SELECT count(*) FROM messages_fts")

    @property
    def cached_agents(self) -> Mapping[str, ConversationIndex]:
        return self._cache

    def index(self, conn: sqlite3.Connection, agent_id: str) -> ConversationIndex:
        """The agent's index, brought up to date with the database: messages
        appended since (by any process) and vectors it lacks that the database
        now holds (stored by another process)."""
        index = self._cache.get(agent_id)
        if index is None:
            index = self._cache[agent_id] = ConversationIndex()
        rows = conn.execute(
            f"SELECT {_INDEX_COLUMNS} FROM messages WHERE agent_id = ? AND seq > ? ORDER BY seq",
            (agent_id, index.last_seq),
        ).fetchall()
        if rows:
            index.add((_indexed(row) for row in rows), _vectors((row[0], row[-1]) for row in rows))
        missing = index.missing_vectors(REFRESH_LIMIT)
        if missing and not rows:
            found = conn.execute(
                "SELECT seq, embedding FROM messages WHERE agent_id = ? AND embedding IS NOT NULL"
                " AND seq IN (SELECT value FROM json_each(?))",
                (agent_id, json.dumps(missing)),
            ).fetchall()
            index.set_vectors(_vectors(found))
        return index

    def added(self, agent_id: str, seqs: list[int], matrix: npt.NDArray[np.float32]) -> None:
        """New vectors, already committed (an uncached agent loads them later)."""
        index = self._cache.get(agent_id)
        if index is not None and seqs:
            index.set_vectors(dict(zip(seqs, matrix, strict=True)))

    def forget(self, agent_id: str) -> None:
        self._cache.pop(agent_id, None)
        self.row_count.reset()

    def dim(self, conn: sqlite3.Connection, agent_id: str) -> int | None:
        """Embedding length of the agent's messages (None before the first)."""
        index = self._cache.get(agent_id)
        if index is not None and index.dim is not None:
            return index.dim
        row = conn.execute(
            "SELECT length(embedding) / 4 FROM messages WHERE agent_id = ? AND embedding IS NOT NULL LIMIT 1",
            (agent_id,),
        ).fetchone()
        return None if row is None else int(row[0])

    def search(
        self,
        conn: sqlite3.Connection,
        agent_id: str,
        text: str,
        query: npt.NDArray[np.float32] | None,
        limit: int,
        offset: int,
        visible: Visibility | None = None,
    ) -> tuple[list[int], int]:
        """Seqs of one page, best first, and how many candidates were ranked."""
        ranked = self.index(conn, agent_id).rank(text, query, limit, offset, visible=visible)
        return [seq for seq, _ in ranked.items], ranked.total

    def rows_inserted(self, count: int) -> None:
        """FTS rows this process added (kept current between re-reads)."""
        self.row_count.add(count)


# What the index needs of a message, the embedding last.
_INDEX_COLUMNS = "seq, role, content, tool_calls, name, created_at, place, speaker_name, embedding"


def _indexed(row: Sequence[Any]) -> Message:
    seq, role, content, tool_calls, name, created_at, place, speaker_name, _ = row
    return Message(
        role=role,
        content=content,
        tool_calls=json.loads(tool_calls) if tool_calls else None,
        name=name,
        created_at=datetime.fromtimestamp(created_at, UTC),
        seq=seq,
        place=place,
        speaker_name=speaker_name,
    )


def _vectors(rows: Iterable[tuple[int, bytes | None]]) -> dict[int, npt.NDArray[np.float32]]:
    return {seq: np.frombuffer(blob, dtype=_F32) for seq, blob in rows if blob is not None}
