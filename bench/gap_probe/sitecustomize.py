"""bench/server_gap.py --count: loaded into the `memgpt-bot chat` process it
starts (this folder is put first on its PYTHONPATH), and only when
SERVER_GAP_PROBE names an output file. Between two LLM requests it counts the
calls handed to worker threads (a SQLite statement batch, an embedding: each a
thread hop the event loop waits on) and the main thread's CPU time, and writes
them, one record per gap, when the process exits. Counts hold on a busy machine
where times do not."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import sys
import time
from typing import Any

OUT = os.environ.get("SERVER_GAP_PROBE", "")

if OUT:
    import httpx2

    gaps: list[dict[str, Any]] = []
    from memory.sqlite.base import DatabaseWorker

    # db_ms: the time at least one store call was under way (calls in flight at
    # once, which the worker takes in one wake-up, count once); rounds: how
    # many times the bot went from no store call to one (waits one after another).
    current: dict[str, Any] = {"hops": [], "cpu": None, "wall": 0.0, "db_ms": 0.0, "rounds": 0}
    in_flight = {"count": 0, "since": 0.0}
    run_in_executor = asyncio.BaseEventLoop.run_in_executor
    run_on_worker = DatabaseWorker.run
    send = httpx2.AsyncClient.send

    async def counted_run_on_worker(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        if name.endswith("<locals>.job"):  # run_in_db's wrapper: name the caller's caller
            name = sys._getframe(3).f_code.co_qualname  # past _call and run_in_db
        current["hops"].append(name)
        if in_flight["count"] == 0:
            in_flight["since"] = time.perf_counter()
            current["rounds"] += 1
        in_flight["count"] += 1
        try:
            return await run_on_worker(self, fn, *args, **kwargs)
        finally:
            in_flight["count"] -= 1
            if in_flight["count"] == 0:
                current["db_ms"] += (time.perf_counter() - in_flight["since"]) * 1000

    def counted_run_in_executor(self: Any, executor: Any, func: Any, *args: Any) -> Any:
        inner = getattr(func, "func", func)  # functools.partial
        current["hops"].append(getattr(inner, "__qualname__", type(inner).__name__))
        return run_in_executor(self, executor, func, *args)

    async def counted_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        if current["cpu"] is not None:
            gaps.append(
                {
                    "hops": current["hops"],
                    "cpu_ms": (time.thread_time() - current["cpu"]) * 1000,
                    "wall_ms": (time.perf_counter() - current["wall"]) * 1000,
                    "db_ms": current["db_ms"],
                    "rounds": current["rounds"],
                }
            )
        current["hops"], current["db_ms"], current["rounds"] = [], 0.0, 0
        try:
            return await send(self, *args, **kwargs)
        finally:
            current["cpu"], current["wall"] = time.thread_time(), time.perf_counter()

    asyncio.BaseEventLoop.run_in_executor = counted_run_in_executor  # type: ignore[method-assign]
    httpx2.AsyncClient.send = counted_send  # type: ignore[method-assign]
    DatabaseWorker.run = counted_run_on_worker  # type: ignore[method-assign]

    @atexit.register
    def _write() -> None:
        with open(OUT, "w") as out:
            json.dump(gaps, out)
