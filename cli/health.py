"""`memgpt-bot run`'s health endpoint and Prometheus metrics (the events are
counted where they enter, at the agents' doors: bot/door.py).

With MEMGPT_METRICS_PORT set, an HTTP server on MEMGPT_METRICS_HOST (default
127.0.0.1) answers:

- `GET /healthz`: 200 and JSON when the store answers and every adapter is
  connected; 503 (same JSON, saying what is wrong) otherwise.
- `GET /metrics`: the Prometheus text format (bot/metrics.py), with the pending
  inbox and outbox entries and the agents in memory read at scrape time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bot import metrics

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)

STORE_CHECK_TIMEOUT = 5.0


class Startable(Protocol):
    async def wait_ready(self) -> None: ...


class HealthServer:
    def __init__(self, runtime: Runtime, adapters: Mapping[str, Startable], host: str, port: int) -> None:
        self.runtime = runtime
        self.adapters = adapters
        self.host, self.port = host, port
        self.connected: set[str] = set()
        self._watchers: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        if self._runner.addresses:  # port 0 (tests): the one the system chose
            self.port = int(self._runner.addresses[0][1])
        self._watchers = [
            asyncio.create_task(self._watch(name, adapter), name=f"ready-{name}")
            for name, adapter in self.adapters.items()
        ]

    async def _watch(self, name: str, adapter: Startable) -> None:
        await adapter.wait_ready()
        self.connected.add(name)

    async def close(self) -> None:
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def healthz(self, _request: web.Request) -> web.Response:
        platforms = {name: "connected" if name in self.connected else "not connected" for name in self.adapters}
        try:
            await asyncio.wait_for(self.runtime.store.find_agent("health:check"), STORE_CHECK_TIMEOUT)
            store = "ok"
        except Exception as error:  # any failure is the answer: storage is not usable
            store = f"error: {type(error).__name__}"
        healthy = store == "ok" and all(state == "connected" for state in platforms.values())
        body = {"status": "ok" if healthy else "unhealthy", "store": store, "platforms": platforms}
        return web.json_response(body, status=200 if healthy else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        await refresh_gauges(self.runtime, list(self.adapters))
        return web.Response(body=generate_latest(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def refresh_gauges(runtime: Runtime, platforms: list[str]) -> None:
    """The gauges that are read, not counted: pending inbox and outbox entries, agents loaded."""
    metrics.AGENTS_LOADED.set(runtime.agents_in_memory)
    for platform in platforms:
        try:
            metrics.PENDING_INBOX.labels(platform).set(len(await runtime.store.inbox_pending(platform)))
            metrics.PENDING_OUTBOX.labels(platform).set(len(await runtime.store.outbox_pending(platform)))
        except Exception as error:  # storage down: the counts are unknown, /healthz says why
            log.debug("metrics: cannot read the inbox of %s: %s", platform, error)
