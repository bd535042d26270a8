"""Hybrid recall search for the SQLite store: FTS5 bm25 over messages fused
with the embeddings of the messages that have one.

Messages are embedded lazily (memory/recall.py), so an agent's history is in
part embedded and in part not. The candidates of a search are the agent's
best keyword hits (embedded or not) and its nearest embedded messages; each
is ranked by the archival formula (memory.search.hybrid): cosine + KEYWORD_WEIGHT x
BM25 coverage, a message without a vector counting cosine 0.

Everything here runs on the store's worker thread (the one owning the
connection). Vectors are keyed by seq and held per agent in an LRU-bounded
cache of exact VectorIndexes, loaded from the BLOBs on first search. Known
limit: vectors another process stores for an agent this process has cached
are missed until the entry is evicted; those messages are still found by
their keywords.
"""

from __future__ import annotations

import json
import sqlite3
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from memory.search.hybrid import coverage, fuse, keyword_query
from memory.search.vector_index import VectorIndex, check_dimension, embedding_matrix
from memory.sqlite.base import SQLiteBase
from memory.sqlite.search import CachedRowCount, read_vectors, weigh_expressions
from memory.types import Message, SearchPage

_F32 = np.dtype("<f4")

# Hits taken from each side (keywords, meaning) for a page near the top.
CANDIDATE_POOL = 100

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

    async def _hybrid_messages(
        self, agent_id: str, query: str, query_vector: Sequence[float], limit: int, offset: int
    ) -> SearchPage:
        vector = np.asarray(query_vector, dtype=_F32)

        def search(conn: sqlite3.Connection) -> tuple[list[Any], list[int], int]:
            seqs, total = self._recall.search(conn, agent_id, query, vector, limit, max(offset, 0))
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
    """Per-agent message vectors (a bounded cache) and the hybrid recall ranking."""

    def __init__(self, *, max_cached: int = 256) -> None:
        self._max_cached = max(max_cached, 1)
        self._cache: OrderedDict[str, VectorIndex] = OrderedDict()
        self.row_count = CachedRowCount("SELECT count(*) FROM messages_fts")

    @property
    def cached_agents(self) -> Mapping[str, VectorIndex]:
        return self._cache

    def vectors(self, conn: sqlite3.Connection, agent_id: str) -> VectorIndex:
        index = self._cache.get(agent_id)
        if index is not None:
            self._cache.move_to_end(agent_id)
            return index
        index = read_vectors(conn, agent_id, table="messages", key="seq")
        self._cache[agent_id] = index
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return index

    def added(self, agent_id: str, seqs: list[int], matrix: npt.NDArray[np.float32]) -> None:
        """New vectors, already committed (an uncached agent loads them later)."""
        index = self._cache.get(agent_id)
        if index is not None and seqs:
            index.add(seqs, matrix)

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
        query: npt.NDArray[np.float32],
        limit: int,
        offset: int,
    ) -> tuple[list[int], int]:
        """Seqs of one page, best first, and how many candidates were ranked."""
        index = self.vectors(conn, agent_id)
        pool = max(CANDIDATE_POOL, offset + limit)
        keyword = self.keyword_scores(conn, agent_id, text, pool)
        near: dict[int, float] = {}
        if len(index):
            near.update(index.search(query, pool))
            near.update(index.similarity(query, [seq for seq in keyword if seq not in near]))
        # A keyword hit without a vector yet is ranked by its bonus alone.
        for seq in keyword:
            near.setdefault(seq, 0.0)
        ranked = fuse(near, keyword)
        if limit <= 0:
            return [], len(ranked)
        return [seq for seq, _ in ranked[offset : offset + limit]], len(ranked)

    def keyword_scores(self, conn: sqlite3.Connection, agent_id: str, text: str, pool: int) -> dict[int, float]:
        """Coverage (0-1) of the query's expressions by the agent's best
        keyword matches among its messages, by seq."""
        query = keyword_query(text)
        if query is None:
            return {}
        kept, idf_total = weigh_expressions(conn, "messages_fts", query.expressions, self.row_count.get(conn))
        if not kept:
            return {}
        agent = agent_id.replace('"', '""')
        # Rank inside FTS first, then map rowids to seqs (see _search_messages).
        rows = conn.execute(
            "SELECT m.seq, hit.score FROM ("
            "  SELECT rowid AS id, bm25(messages_fts, 0.0, 1.0) AS score FROM messages_fts"
            "  WHERE messages_fts MATCH ? ORDER BY score, rowid LIMIT ?"
            ") AS hit JOIN messages m ON m.id = hit.id WHERE m.agent_id = ?",
            (f'agent_id : "{agent}" AND text : ({query.match(kept)})', pool, agent_id),
        ).fetchall()
        # bm25() is negative, better matches more so.
        return coverage({seq: -score for seq, score in rows}, idf_total)

    def rows_inserted(self, count: int) -> None:
        """FTS rows this process added (kept current between re-reads)."""
        self.row_count.add(count)
