"""The SQLite store's one worker thread: every call of the store runs there,
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
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# A job: where its result goes, the function and its arguments.
_Job = tuple["_Results", "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


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
    def __init__(self, name: str) -> None:
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

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the worker thread, after every job given before it."""
        loop = asyncio.get_running_loop()
        results = self._results.get(loop)
        if results is None:
            results = self._results[loop] = _Results(loop)
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._stopping:
                raise WorkerClosedError("the database worker is stopped")
            self._jobs.append((results, future, fn, args))
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
            for results, future, fn, args in batch:
                if future.cancelled():
                    continue  # its caller gave up before it started, as with a pool's queued job
                try:
                    outcome = fn(*args)
                except BaseException as error:  # handed to the caller, as a pool would
                    results.put(future, None, error)
                else:
                    results.put(future, outcome, None)
