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
import time
from typing import Any

OUT = os.environ.get("SERVER_GAP_PROBE", "")

if OUT:
    import httpx2

    gaps: list[dict[str, Any]] = []
    current: dict[str, Any] = {"hops": [], "cpu": None}
    run_in_executor = asyncio.BaseEventLoop.run_in_executor
    send = httpx2.AsyncClient.send

    def counted_run_in_executor(self: Any, executor: Any, func: Any, *args: Any) -> Any:
        inner = getattr(func, "func", func)  # functools.partial
        current["hops"].append(getattr(inner, "__qualname__", type(inner).__name__))
        return run_in_executor(self, executor, func, *args)

    async def counted_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        if current["cpu"] is not None:
            gaps.append({"hops": current["hops"], "cpu_ms": (time.thread_time() - current["cpu"]) * 1000})
        current["hops"] = []
        try:
            return await send(self, *args, **kwargs)
        finally:
            current["cpu"] = time.thread_time()

    asyncio.BaseEventLoop.run_in_executor = counted_run_in_executor  # type: ignore[method-assign]
    httpx2.AsyncClient.send = counted_send  # type: ignore[method-assign]

    @atexit.register
    def _write() -> None:
        with open(OUT, "w") as out:
            json.dump(gaps, out)
