"""What every part of the SQLite backend builds on (the design is told in
memory/sqlite/store.py): the store's one connection, used only on its worker
thread (`DatabaseWorker`, below), the calls that reach it, and value conversions.

The SQLite store's one worker thread: every call of the store runs there,
in the order it was made, so the event loop never blocks on the database.

Why not a ThreadPoolExecutor with `run_in_executor`: under load (many agents
at once) most of that path's cost was the hand-over per call, not the SQL: a
wake-up of the thread for each job, and for each result a write to the event
loop's self-pipe and a wake-up of the loop, every one a chance for the two
threads to trade the GIL. Here the thread takes every job queued by the time
it wakes, and a result is handed to its loop with one wake-up for all the
results that are ready before the loop gets to them. Measured with
bench/throughput.py (1,000 users, an instant LLM): about 0.4 ms less CPU per
event on a 2-core machine, the same SQL.

Group commit: the store's writes of one wake-up that come one after another
(reads may sit between them) run in one transaction, each job's own writes a
savepoint of it that its failure undoes alone (SQLiteBase._write). A commit
costs more than the writes of a chat event (SQLite's WAL frames, and FTS5
writes a new index segment, then merges, at every commit), and every statement
is a wait for the GIL on this thread. No job's result is handed back before the
commit that stores it, so anything acknowledged is on disk as before; if that
commit fails, every job of the group gets its error and nothing of it is stored.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from memory.places import PUBLIC_END, PUBLIC_PREFIX, Visibility
from memory.store import StoreError

T = TypeVar("T")


# How a job may join a group transaction: not at all, as a read, or as a write.
Grouping = Literal["alone", "read", "write"]


class GroupTransaction(Protocol):
    """The store's side of group commit (SQLiteBase), called on the worker thread."""

    def begin_group(self) -> None: ...

    def commit_group(self) -> None: ...

    def rollback_group(self) -> None: ...


@dataclass(slots=True)
class _Job:
    results: _Results
    future: asyncio.Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    grouping: Grouping


class WorkerClosedError(RuntimeError):
    """A job given to a worker after `stop`."""


class _Results:
    """The results ready for one event loop, handed over in one wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []

    def put(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        """From the worker thread."""
        with self._lock:
            self._ready.append((future, result, error))
            if len(self._ready) > 1:
                return  # the loop is woken already and takes this one too
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting for these results

    def _deliver(self) -> None:
        """On the event loop."""
        with self._lock:
            ready, self._ready = self._ready, []
        for future, result, error in ready:
            if future.done():  # cancelled by its caller meanwhile
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)


class DatabaseWorker:
    def __init__(self, name: str, group: GroupTransaction | None = None) -> None:
        self._group = group
        self._jobs: deque[_Job] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._sleeping = False
        self._stopping = False
        # One hand-over point per event loop that gave jobs (tests run several loops in turn).
        self._results: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Results] = weakref.WeakKeyDictionary()
        # A daemon, like the threads a ThreadPoolExecutor leaves to the interpreter's
        # exit: a store never closed does not keep the process alive.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any, grouping: Grouping = "alone") -> T:
        """`fn(*args)` on the worker thread, after every job given before it;
        with `grouping` "read" or "write", perhaps inside a group transaction."""
        loop = asyncio.get_running_loop()
        results = self._results.get(loop)
        if results is None:
            results = self._results[loop] = _Results(loop)
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._stopping:
                raise WorkerClosedError("the database worker is stopped")
            self._jobs.append(_Job(results, future, fn, args, grouping))
            if self._sleeping:
                self._wake.notify()
        return await future

    def stop(self) -> None:
        """The thread ends once the jobs given before this are done."""
        with self._lock:
            self._stopping = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    if self._stopping:
                        return
                    self._sleeping = True
                    self._wake.wait()
                    self._sleeping = False
                batch = list(self._jobs)
                self._jobs.clear()
            for run in _runs(batch):
                if self._group is not None and sum(job.grouping == "write" for job in run) > 1:
                    self._run_grouped(run, self._group)
                else:
                    for job in run:
                        _deliver(job, *_outcome(job))

    def _run_grouped(self, run: list[_Job], group: GroupTransaction) -> None:
        try:
            group.begin_group()
        except BaseException as error:
            # No write lock to be had (another process holds it): each write would wait for it again in vain.
            for job in run:
                _deliver(job, *((None, error) if job.grouping == "write" else _outcome(job)))
            return
        done = [(job, *_outcome(job)) for job in run]
        try:
            group.commit_group()
        except BaseException as error:
            group.rollback_group()
            done = [(job, None, error) for job, _, _ in done]  # nothing of the group is stored
        for job, result, failure in done:
            _deliver(job, result, failure)


def _runs(batch: list[_Job]) -> list[list[_Job]]:
    """The batch in order, as runs of consecutive jobs that may share a transaction, other jobs alone."""
    runs: list[list[_Job]] = []
    for job in batch:
        if job.grouping != "alone" and runs and runs[-1][-1].grouping != "alone":
            runs[-1].append(job)
        else:
            runs.append([job])
    return runs


def _outcome(job: _Job) -> tuple[Any, BaseException | None]:
    if job.future.cancelled():
        # Its caller gave up before it started, as with a pool's queued job.
        return None, None
    try:
        return job.fn(*job.args), None
    except BaseException as error:  # handed to the caller, as a pool would
        return None, error


def _deliver(job: _Job, result: Any, error: BaseException | None) -> None:
    if not job.future.cancelled():
        job.results.put(job.future, result, error)


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
        # Inside the worker's group transaction (group commit, `DatabaseWorker`).
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

    # -- group commit (`DatabaseWorker`), on the worker thread --------
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
        database (inbox, leases, usage, check-in schedules) and must share its
        connection and order."""

        def job() -> T:
            if not write:
                return fn(self._db)
            with self._write() as conn:
                return fn(conn)

        return await self._call(job, grouping="write" if write else "read")
