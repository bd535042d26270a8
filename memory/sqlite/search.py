"""Hybrid archival search for the SQLite store: FTS5 bm25 over analysed terms
(memory/sqlite/terms.py) fused with vectors.

Everything here runs on the store's worker thread (the one that owns the
connection), except ANN builds, which run on a background thread of their own
and are swapped in by the worker thread once done.

Per agent, the vectors live in memory in one of two forms:

- exact (VectorIndex) while the agent holds fewer than ANN_THRESHOLD
  vectors: the whole archive is ranked by cosine + keyword bonus, so `total`
  is every embedded passage and pages are exact at any depth;
- approximate (AnnIndex, usearch) above it, persisted beside the database and
  reloaded on the next start: a candidate pool (the nearest CANDIDATE_POOL by
  vector plus the best CANDIDATE_POOL by keyword) is ranked, and `total` is the
  size of that pool.

While an ANN index is being built the exact one keeps serving, and changes
made meanwhile are replayed onto the new index before it takes over.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from memory.places import Visibility
from memory.search.ann_index import ANN_THRESHOLD, AnnIndex, AnnParams, Signature, remove_files
from memory.search.hybrid import KEYWORD_WEIGHT, coverage, fuse, idf
from memory.search.vector_index import VectorIndex
from memory.sqlite.base import visible_sql
from memory.sqlite.terms import term_expressions
from memory.store import StoreError

log = logging.getLogger(__name__)

_F32 = np.dtype("<f4")

# Hits taken from each side when the archive is searched approximately.
CANDIDATE_POOL = 100
# A search limited to some places asks the ANN index for the pool divided by
# the visible share, times this margin, keeps the visible hits, and ranks the
# visible passages exactly when too few survive, or straight away when the
# over-fetch would exceed MAX_OVERFETCH (so few are visible that ranking them
# all costs less than a search that wide).
VISIBLE_OVERFETCH = 2
MAX_OVERFETCH = 4_000
# An expression held by more rows than this is left out of the keyword query:
# scoring it costs time in proportion to its rows, and its IDF (its weight in
# bm25) is small anyway. Meaning search still covers such common words.
MAX_ROWS_PER_EXPRESSION = 5_000
# Up to this many passages an agent's keyword search filters by agent inside
# FTS5 (cost grows with the agent's passages); above it, FTS5 searches all
# rows for the query's rarer expressions and a join keeps the agent's.
AGENT_FILTER_MAX = 5_000
# The FTS5 row count (for IDF) is kept up to date by this process and re-read
# this often, to follow other processes and cascaded deletes.
ROW_COUNT_TTL = 60.0

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


@dataclass(slots=True)
class _Build:
    future: Future[AnnIndex]
    # Changes made while the build ran, replayed onto it before it is used.
    journal: list[tuple[str, list[int], npt.NDArray[np.float32] | None]] = field(default_factory=list)


@dataclass(slots=True)
class AgentVectors:
    """One agent's embeddings, exact or approximate."""

    exact: VectorIndex | None = None
    ann: AnnIndex | None = None
    build: _Build | None = None
    build_failed: bool = False
    changes_since_save: int = 0

    def __len__(self) -> int:
        if self.ann is not None:
            return len(self.ann)
        return len(self.exact) if self.exact is not None else 0

    def __contains__(self, item: int) -> bool:
        if self.ann is not None:
            return item in self.ann
        return self.exact is not None and item in self.exact

    @property
    def dim(self) -> int | None:
        if self.ann is not None:
            return self.ann.dim
        return self.exact.dim if self.exact is not None else None

    def add(self, ids: list[int], matrix: npt.NDArray[np.float32]) -> None:
        if self.ann is not None:
            self.ann.add(ids, matrix)
        elif self.exact is not None:
            self.exact.add(ids, matrix)
        if self.build is not None:
            self.build.journal.append(("add", ids, matrix))
        self.changes_since_save += len(ids)

    def remove(self, ids: list[int]) -> None:
        if self.ann is not None:
            self.ann.remove(ids)
        elif self.exact is not None:
            self.exact.remove(ids)
        if self.build is not None:
            self.build.journal.append(("remove", ids, None))
        self.changes_since_save += len(ids)


class PassageSearch:
    """Per-agent vector indexes (a bounded cache) and the hybrid ranking."""

    def __init__(
        self,
        db_path: Path,
        *,
        max_cached: int = 256,
        ann_threshold: int = ANN_THRESHOLD,
        ann_params: AnnParams | None = None,
        build_threads: int | None = None,
    ) -> None:
        self.ann_dir = db_path.with_name(db_path.name + ".ann")
        self.ann_threshold = ann_threshold
        self.ann_params = ann_params or AnnParams()
        # One core is left to the event loop and the database while a build runs.
        self.build_threads = build_threads or max(1, (os.cpu_count() or 2) - 1)
        self._max_cached = max(max_cached, 1)
        self._cache: OrderedDict[str, AgentVectors] = OrderedDict()
        self._build_lock = threading.Lock()
        self.row_count = CachedRowCount("SELECT count(*) FROM passages")

    # -- the cache -------------------------------------------------------------
    @property
    def cached_agents(self) -> Mapping[str, AgentVectors]:
        return self._cache

    def cached(self, agent_id: str) -> AgentVectors | None:
        entry = self._cache.get(agent_id)
        if entry is not None:
            self._poll(agent_id, entry)
        return entry

    def vectors(self, conn: sqlite3.Connection, agent_id: str) -> AgentVectors:
        """The agent's vectors: from the cache, the saved ANN file, or SQLite."""
        entry = self.cached(agent_id)
        if entry is not None:
            self._cache.move_to_end(agent_id)
            return entry
        entry = self._load(conn, agent_id)
        self._cache[agent_id] = entry
        while len(self._cache) > self._max_cached:
            self._evict()
        return entry

    def _load(self, conn: sqlite3.Connection, agent_id: str) -> AgentVectors:
        path = self.ann_path(agent_id)
        signature = embedded_signature(conn, agent_id)
        if signature.count >= self.ann_threshold and path.exists():
            dim = self.dim(conn, agent_id)
            ann = AnnIndex.load(path, signature, dim, self.ann_params) if dim else None
            if ann is not None:
                return AgentVectors(ann=ann)
        entry = AgentVectors(exact=read_vectors(conn, agent_id))
        if len(entry) >= self.ann_threshold:
            self._start_build(entry)
        elif path.exists():
            # Small again (or never finished): searched exactly; a file left
            # behind could only go stale.
            remove_files(path)
        return entry

    def _evict(self) -> None:
        idle = next((agent_id for agent_id, entry in self._cache.items() if entry.build is None), None)
        if idle is None:
            return  # every entry is mid-build: keep them all for now
        self._save(idle, self._cache.pop(idle))

    def dim(self, conn: sqlite3.Connection, agent_id: str) -> int | None:
        """Embedding length of the agent's passages (None before the first)."""
        entry = self.cached(agent_id)
        if entry is not None and entry.dim is not None:
            return entry.dim
        row = conn.execute(
            "SELECT length(embedding) / 4 FROM passages WHERE agent_id = ? AND embedding IS NOT NULL LIMIT 1",
            (agent_id,),
        ).fetchone()
        return None if row is None else int(row[0])

    def ann_path(self, agent_id: str) -> Path:
        if not _SAFE_NAME.match(agent_id):
            raise ValueError(f"agent id {agent_id!r} cannot name an index file")
        return self.ann_dir / f"{agent_id}.usearch"

    # -- changes ---------------------------------------------------------------
    def added(self, agent_id: str, ids: list[int], matrix: npt.NDArray[np.float32]) -> None:
        """New or replaced vectors, already committed to SQLite."""
        entry = self.cached(agent_id)
        if entry is None or not ids:
            return
        entry.add(ids, matrix)
        if entry.ann is None and entry.build is None and not entry.build_failed and len(entry) >= self.ann_threshold:
            self._start_build(entry)
        self._maybe_save(agent_id, entry)

    def removed(self, agent_id: str, ids: list[int], rows_deleted: int) -> None:
        self.row_count.add(-rows_deleted)
        entry = self.cached(agent_id)
        if entry is not None and ids:
            entry.remove(ids)
            self._maybe_save(agent_id, entry)

    def rows_inserted(self, count: int) -> None:
        self.row_count.add(count)

    def forget(self, agent_id: str) -> None:
        """The agent is gone: drop its vectors from memory and disk."""
        self._cache.pop(agent_id, None)
        self.row_count.reset()
        with contextlib.suppress(ValueError):
            remove_files(self.ann_path(agent_id))

    def close(self) -> None:
        """Save every changed ANN index (a restart then loads instead of rebuilding)."""
        for agent_id, entry in list(self._cache.items()):
            self._save(agent_id, entry)
        self._cache.clear()

    # -- ANN builds ------------------------------------------------------------
    def _start_build(self, entry: AgentVectors) -> None:
        assert entry.exact is not None
        ids, matrix = entry.exact.vectors()
        future: Future[AnnIndex] = Future()

        def run() -> None:
            # One build at a time, whatever the number of agents crossing the threshold.
            with self._build_lock:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    future.set_result(AnnIndex.build(ids, matrix, self.ann_params, threads=self.build_threads))
                except BaseException as error:
                    future.set_exception(error)

        entry.build = _Build(future)
        # A daemon thread: a build in flight must not hold up process exit.
        threading.Thread(target=run, name="ann-build", daemon=True).start()

    def _poll(self, agent_id: str, entry: AgentVectors) -> None:
        build = entry.build
        if build is None or not build.future.done():
            return
        entry.build = None
        try:
            ann = build.future.result()
        except Exception:
            log.exception("agent %s: ANN build failed; searching exactly", agent_id)
            entry.build_failed = True
            return
        for op, ids, matrix in build.journal:
            if op == "add" and matrix is not None:
                ann.add(ids, matrix)
            else:
                ann.remove(ids)
        entry.ann, entry.exact = ann, None
        entry.changes_since_save = len(ann)
        self._save(agent_id, entry)

    def wait_for_builds(self, timeout: float | None = None) -> None:
        """Block until running builds finish and swap them in (tests, benches)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for agent_id, entry in list(self._cache.items()):
            if entry.build is not None:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                with contextlib.suppress(Exception):
                    entry.build.future.exception(timeout=remaining)
                self._poll(agent_id, entry)

    def _maybe_save(self, agent_id: str, entry: AgentVectors) -> None:
        # Bounds the work a crash can cost (a rebuild) without writing the
        # file on every insert.
        if entry.ann is not None and entry.changes_since_save >= max(1_000, len(entry.ann) // 20):
            self._save(agent_id, entry)

    def _save(self, agent_id: str, entry: AgentVectors) -> None:
        if entry.ann is None or not (entry.ann.dirty or entry.ann.path is None):
            return
        try:
            entry.ann.save(self.ann_path(agent_id))
            entry.changes_since_save = 0
        except (OSError, RuntimeError, ValueError) as error:
            # The index still serves from memory; the next start rebuilds it.
            log.warning("agent %s: could not save its ANN index: %s", agent_id, error)

    # -- search ----------------------------------------------------------------
    def search(
        self,
        conn: sqlite3.Connection,
        agent_id: str,
        text: str,
        query: npt.NDArray[np.float32],
        limit: int,
        offset: int,
        *,
        visible: Visibility | None = None,
    ) -> tuple[list[tuple[int, float]], int]:
        """(passage id, relevance) for one page, and how many were ranked;
        with `visible`, only passages it sees are ranked (the filter comes
        before ranking and paging, on the exact and the approximate path)."""
        entry = self.vectors(conn, agent_id)
        allowed = None if visible is None or visible.everything else self._visible_ids(conn, agent_id, visible)
        if not len(entry) or (allowed is not None and not allowed):
            return [], 0
        if limit <= 0:
            return [], len(entry) if allowed is None else sum(1 for item in allowed if item in entry)
        keyword = self.keyword_scores(conn, agent_id, text, entry, visible)
        if entry.ann is None:
            assert entry.exact is not None
            if allowed is not None:
                ranked = fuse(entry.exact.similarity(query, allowed), keyword)
                return ranked[offset : offset + limit], len(ranked)
            bonus = {item: KEYWORD_WEIGHT * share for item, share in keyword.items()}
            hits = entry.exact.search(query, offset + limit, boost=bonus)
            return hits[offset:], len(entry.exact)
        pool = max(CANDIDATE_POOL, offset + limit)
        near: dict[int, float] = {}
        if allowed is None:
            near = dict(entry.ann.search(query, pool))
        else:
            wanted = math.ceil(pool * VISIBLE_OVERFETCH * len(entry) / len(allowed))
            if wanted <= MAX_OVERFETCH:
                hits = entry.ann.search(query, min(wanted, len(entry)))
                near = {item: score for item, score in hits if item in allowed}
            if len(near) < min(pool, len(allowed)):
                near = entry.ann.similarity(query, allowed)  # exact over the visible ones
        near.update(entry.ann.similarity(query, [item for item in keyword if item not in near]))
        ranked = fuse(near, keyword)
        return ranked[offset : offset + limit], len(ranked)

    @staticmethod
    def _visible_ids(conn: sqlite3.Connection, agent_id: str, visible: Visibility) -> set[int]:
        """Ids of the agent's passages that `visible` sees (from the (agent_id,
        place) index, never reading a row). Some may have no vector yet: the
        rankings skip those."""
        where, args = visible_sql(visible)
        rows = conn.execute(f"SELECT id FROM passages WHERE agent_id = ?{where}", (agent_id, *args))
        return {passage_id for (passage_id,) in rows}

    def keyword_scores(
        self,
        conn: sqlite3.Connection,
        agent_id: str,
        text: str,
        entry: AgentVectors,
        visible: Visibility | None = None,
    ) -> dict[int, float]:
        """Coverage (0-1) of the query's terms by the agent's best
        keyword matches (those `visible` sees), for passages that have a vector."""
        expressions = term_expressions(text)
        if not expressions:
            return {}
        kept, idf_total = weigh_expressions(conn, "passages_fts", expressions, self.row_count.get(conn))
        if not kept:
            return {}
        terms = " OR ".join(kept)
        where, args = visible_sql(visible, "p.place")
        if where:
            # Filtered before the LIMIT: the best visible hits, never the
            # best hits with the invisible ones dropped afterwards.
            agent = agent_id.replace('"', '""')
            rows = conn.execute(
                "SELECT f.rowid, bm25(passages_fts, 0.0, 1.0) AS score FROM passages_fts f"
                f" CROSS JOIN passages p ON p.id = f.rowid WHERE passages_fts MATCH ? AND p.agent_id = ?{where}"
                " ORDER BY score, f.rowid LIMIT ?",
                (f'agent_id : "{agent}" AND text : ({terms})', agent_id, *args, CANDIDATE_POOL),
            ).fetchall()
        elif len(entry) <= AGENT_FILTER_MAX:
            agent = agent_id.replace('"', '""')
            rows = conn.execute(
                "SELECT rowid, bm25(passages_fts, 0.0, 1.0) AS score FROM passages_fts"
                " WHERE passages_fts MATCH ? ORDER BY score, rowid LIMIT ?",
                (f'agent_id : "{agent}" AND text : ({terms})', CANDIDATE_POOL),
            ).fetchall()
        else:
            rows = conn.execute(
                "SELECT f.rowid, bm25(passages_fts, 0.0, 1.0) AS score FROM passages_fts f"
                " JOIN passages p ON p.id = f.rowid WHERE passages_fts MATCH ? AND p.agent_id = ?"
                " ORDER BY score, f.rowid LIMIT ?",
                (f"text : ({terms})", agent_id, CANDIDATE_POOL),
            ).fetchall()
        # bm25() is negative, better matches more so.
        return coverage({rowid: -score for rowid, score in rows if rowid in entry}, idf_total)


def embedded_signature(conn: sqlite3.Connection, agent_id: str) -> Signature:
    """Count, id sum and max id of the agent's embedded passages, from two
    index scans (all of its passages, minus the pending ones), never reading
    the embedding BLOBs."""
    count, id_sum, max_id = conn.execute(
        "SELECT count(*), coalesce(sum(id), 0), coalesce(max(id), 0) FROM passages WHERE agent_id = ?",
        (agent_id,),
    ).fetchone()
    pending = conn.execute(
        "SELECT count(*), coalesce(sum(id), 0), coalesce(max(id), 0) FROM passages"
        " WHERE agent_id = ? AND embedding IS NULL",
        (agent_id,),
    ).fetchone()
    if pending[0] and pending[2] == max_id:
        (max_id,) = conn.execute(
            "SELECT coalesce(max(id), 0) FROM passages WHERE agent_id = ? AND embedding IS NOT NULL", (agent_id,)
        ).fetchone()
    return Signature(count - pending[0], id_sum - pending[1], max_id)


def read_vectors(conn: sqlite3.Connection, agent_id: str, *, table: str = "passages", key: str = "id") -> VectorIndex:
    """The agent's embeddings in `table` (passages by id, messages by seq),
    read from the BLOBs into an exact index."""
    rows = conn.execute(
        f"SELECT {key}, embedding FROM {table} WHERE agent_id = ? AND embedding IS NOT NULL", (agent_id,)
    ).fetchall()
    index = VectorIndex(capacity=max(64, len(rows)))
    if rows:
        if len({len(blob) for _, blob in rows}) != 1:
            raise StoreError(f"agent {agent_id} has {table} embeddings of mixed lengths")
        matrix = np.frombuffer(b"".join(blob for _, blob in rows), dtype=_F32)
        index.add([row_key for row_key, _ in rows], matrix.reshape(len(rows), -1))
    return index


def weigh_expressions(
    conn: sqlite3.Connection, fts_table: str, expressions: Sequence[str], total_rows: int
) -> tuple[list[str], float]:
    """The query expressions worth matching in `fts_table`, and the summed IDF
    of all of them (the best possible BM25 score, for coverage). Shared by
    passage and message search. An expression in too many rows is skipped (it
    says nothing and is slow to rank); one in no row still counts in the
    whole, so a query about things never mentioned earns only a small bonus."""
    kept: list[str] = []
    idf_total = 0.0
    for expression in expressions:
        (rows_with,) = conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {fts_table} WHERE {fts_table} MATCH ? LIMIT ?)",
            (f"text : {expression}", MAX_ROWS_PER_EXPRESSION + 1),
        ).fetchone()
        if rows_with > MAX_ROWS_PER_EXPRESSION:
            continue
        # A cached row count may lag the table a little: never below the hits.
        idf_total += idf(max(total_rows, rows_with), rows_with)
        if rows_with:
            kept.append(expression)
    return kept, idf_total


class CachedRowCount:
    """A table's row count, for IDF. count(*) is a table scan, so the count is
    kept current by this process and re-read only every ROW_COUNT_TTL seconds,
    to follow other processes. Never below 1 (it divides)."""

    def __init__(self, count_sql: str) -> None:
        self._sql = count_sql
        self._rows: int | None = None
        self._read_at = 0.0

    def get(self, conn: sqlite3.Connection) -> int:
        now = time.monotonic()
        if self._rows is None or now - self._read_at > ROW_COUNT_TTL:
            (self._rows,) = conn.execute(self._sql).fetchone()
            self._read_at = now
        return max(self._rows or 0, 1)

    def add(self, count: int) -> None:
        if self._rows is not None:
            self._rows += count

    def reset(self) -> None:
        self._rows = None
