"""What every part of the SQLite backend builds on (the design is told in
memory/sqlite/store.py): the store's one connection, used only on its worker
thread, the calls that reach it, and value conversions.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from memory.places import PUBLIC_END, PUBLIC_PREFIX, Visibility
from memory.sqlite.worker import DatabaseWorker, Grouping
from memory.store import StoreError

T = TypeVar("T")


def to_ts(moment: datetime) -> float:
    # A naive datetime is taken as UTC, never as the server's local time.
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def from_ts(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def visible_sql(visible: Visibility | None, column: str = "place") -> tuple[str, tuple[str, ...]]:
    """The Visibility as " AND (...)" on `column` and its arguments; ("", ())
    when everything is visible."""
    if visible is None or visible.everything:
        return "", ()
    places = sorted(visible.places)
    terms = [f"{column} IN ({', '.join('?' * len(places))})"] if places else []
    args: list[str] = list(places)
    if visible.public:
        terms.append(f"({column} >= ? AND {column} < ?)")
        args += [PUBLIC_PREFIX, PUBLIC_END]
    return f" AND ({' OR '.join(terms) or '0'})", tuple(args)


class SQLiteBase:
    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 5.0) -> None:
        self.path = Path(path)
        self._busy_timeout = busy_timeout
        self._worker: DatabaseWorker | None = None
        # Only touched from the worker thread.
        self._conn: sqlite3.Connection | None = None
        # Inside the worker's group transaction (group commit, memory/sqlite/worker.py).
        self._grouped = False

    # -- plumbing ----------------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any, grouping: Grouping = "alone") -> T:
        """`fn(*args)` on the worker thread. `grouping`: "write" for a job whose
        writes are all inside `_write` and whose other effects may come before
        the commit, "read" for a plain read; such jobs may share a transaction."""
        worker = self._worker
        if worker is None:
            raise StoreError(f"SQLite store {self.path} is not open")
        try:
            return await worker.run(fn, *args, grouping=grouping)
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
        return await self._call(self._fetch, sql, args, grouping="read")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; IMMEDIATE so read-then-write cannot race
        another process between the read and the write. Inside a group
        transaction, a savepoint of it: undone alone if the job fails."""
        conn = self._db
        if not self._grouped:
            conn.execute("BEGIN IMMEDIATE")
            with conn:
                yield conn
            return
        if not conn.in_transaction:
            # SQLite rolled the group back after an earlier job's error (disk full, I/O):
            # writing now would commit at once, outside the group, yet be reported failed.
            raise sqlite3.OperationalError("the group transaction was rolled back")
        conn.execute("SAVEPOINT job")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
            raise
        conn.execute("RELEASE job")

    # -- group commit (memory/sqlite/worker.py), on the worker thread --------
    def begin_group(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        self._grouped = True

    def commit_group(self) -> None:
        self._grouped = False
        conn = self._db
        if not conn.in_transaction:
            raise sqlite3.OperationalError("the group transaction was rolled back")
        conn.execute("COMMIT")

    def rollback_group(self) -> None:
        self._grouped = False
        conn = self._db
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    async def run_in_db(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = False) -> T:
        """Run `fn(connection)` on this store's worker thread, inside one write
        transaction if `write`. For the parts that keep their own tables in this
        database (journal, leases, usage, check-in schedules) and must share its
        connection and order."""

        def job() -> T:
            if not write:
                return fn(self._db)
            with self._write() as conn:
                return fn(conn)

        return await self._call(job, grouping="write" if write else "read")
