"""Test helper: one bot process for the multi-process tests
(tests/test_multiprocess.py): a real Runtime on a MongoDB database, talking to
the test's scripted LLM server over HTTP.

    python -m tests.lease_worker    # settings from the environment:
        MONGODB_URI, MONGODB_DB, LLM_BASE_URL, MEMGPT_LEASES / MEMGPT_LEASE_TTL / ...

Reads one JSON object per line on stdin:

    {"op": "event", "id": "u03-7", "user": "u03", "text": "..."}   handle it (events run concurrently)
    {"op": "quit"}                                                 finish the events in hand, then exit

and writes one per line on stdout:

    {"op": "ready", "pid": 1234}
    {"op": "joined", "id": "u03-7", "seq": 12}     the event has its place in the agent's line
    {"op": "replied", "id": "u03-7", "texts": ["..."], "error": null}
    {"op": "bye"}
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bot.config import Settings
from bot.durable.leases import AgentLeases
from bot.events import UserMessage
from bot.llm import LLMClient
from bot.runtime import Runtime
from bot.settings import LeaseSettings
from memory.embeddings import Embedder
from memory.mongo.store import MongoStore

PLATFORM = "test"
_event_id: contextvars.ContextVar[str] = contextvars.ContextVar("event_id", default="?")


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def build_runtime(data_dir: Path) -> Runtime:
    settings = Settings(
        openai_api_key="test-key",
        model="test-model",
        context_window=8_192,
        data_dir=data_dir,
        llm_timeout=20.0,
        llm_max_retries=2,
        response_reserve=256,
        # MEMGPT_LEASES / _TTL / _RENEW / _WAIT from the test, as Settings.from_env would read them.
        leases=LeaseSettings.from_env(os.environ),
    )
    settings.validate()
    llm = LLMClient(
        settings.model,
        api_key=settings.openai_api_key,
        base_url=os.environ["LLM_BASE_URL"],
        timeout=settings.llm_timeout,
        max_retries=settings.llm_max_retries,
    )
    store = MongoStore(os.environ["MONGODB_URI"], os.environ["MONGODB_DB"], server_selection_timeout=10.0)
    return await Runtime.create(settings, store=store, llm=llm, embedder=Embedder())


async def handle(runtime: Runtime, request: dict[str, Any]) -> None:
    _event_id.set(request["id"])  # this task's own context: on_join reads it
    event = UserMessage(platform=PLATFORM, user_id=request["user"], text=request["text"], event_id=request["id"])
    try:
        replies = await runtime.handle(event)
    except Exception as error:
        logging.exception("event %s failed", request["id"])
        emit({"op": "replied", "id": request["id"], "texts": [], "error": f"{type(error).__name__}: {error}"})
        return
    emit({"op": "replied", "id": request["id"], "texts": [reply.text for reply in replies], "error": None})


async def watch_lag() -> None:
    """Say when this process's event loop was blocked (a lost lease is often that)."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(0.1)
        late = time.monotonic() - before - 0.1
        if late > 0.5:
            logging.warning("event loop blocked for %.2f s", late)


async def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"[worker {os.getpid()}] %(message)s")
    with tempfile.TemporaryDirectory(prefix="lease-worker-") as folder:
        runtime = await build_runtime(Path(folder))
        leases = runtime.leases
        if isinstance(leases, AgentLeases):
            leases.on_join = lambda key, seq: emit({"op": "joined", "id": _event_id.get(), "seq": seq})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        emit({"op": "ready", "pid": os.getpid()})
        lag_watch = asyncio.create_task(watch_lag())
        tasks: set[asyncio.Task[None]] = set()
        while line := await reader.readline():
            request = json.loads(line)
            if request["op"] == "quit":
                break
            # A task per event, created in arrival order: the runtime keeps that order.
            task = asyncio.create_task(handle(runtime, request), context=contextvars.copy_context())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        lag_watch.cancel()
        await runtime.close()
    emit({"op": "bye"})


if __name__ == "__main__":
    asyncio.run(main())
