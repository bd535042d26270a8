"""`memgpt-bot run`: every configured platform adapter in one process, sharing
one runtime. Says which adapters started and which were skipped, and why."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any, Protocol

from adapters.platforms import PLATFORMS, plan_platform
from bot.durable.redelivery import Redelivery
from bot.events import Redo, Reply
from bot.ports import AdapterPort
from memory.store import StoreError
from memory.types import utc_now

if TYPE_CHECKING:
    from bot.runtime import Runtime
    from cli.health import HealthServer

log = logging.getLogger(__name__)

READY_TIMEOUT = 60.0


class Adapter(Protocol):
    async def start(self) -> None: ...

    async def wait_ready(self) -> None:
        """Return once the adapter can send (connected)."""
        ...

    async def deliver(self, replies: list[Reply]) -> None:
        """Send replies that answer no platform message (check-ins, reminders,
        outbox retries), reporting each durable one to the bot."""
        ...

    def hold_new_events(self) -> None:
        """Until `recover` has put the last run's unfinished events in line,
        new ones wait: a new message never overtakes a replay of an older one."""
        ...

    async def recover(self) -> int:
        """Replay the events a crash left unfinished (bot/durable/) and wait
        for them; how many. Called once ready, before check-ins start."""
        ...

    async def replay(self, redos: list[Redo]) -> int:
        """Handle recorded events again, in order (events that waited for storage)."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class AdapterPlan:
    name: str
    adapter: Adapter | None
    reason: str  # why it starts (its mode) or why it was skipped


class NoAdapterError(Exception):
    """No platform has credentials configured, or every adapter stopped with an error."""


def plan_adapters(bot: AdapterPort, env: Mapping[str, str] | None = None) -> list[AdapterPlan]:
    env = os.environ if env is None else env
    plans = []
    for name in PLATFORMS:  # adapters/platforms.py
        try:
            adapter, reason = plan_platform(name, bot, env)
        except ImportError as error:  # a platform library missing from this install
            adapter, reason = None, f"cannot load its library ({error})"
        plans.append(AdapterPlan(name, adapter, reason))
    return plans


async def serve(runtime: Runtime, announce: Callable[[str], Any], env: Mapping[str, str] | None = None) -> None:
    """Run the configured adapters on `runtime`, with the check-in scheduler
    delivering through them, until a signal or until every adapter stops."""
    from bot.checkins.scheduler import CheckinScheduler

    plans = plan_adapters(runtime, runtime.settings.environment if env is None else env)
    adapters = {plan.name: plan.adapter for plan in plans if plan.adapter is not None}
    for adapter in adapters.values():
        adapter.hold_new_events()  # until its recover() below
    health = await _start_health(runtime, adapters, announce)

    async def deliver(replies: list[Reply]) -> None:
        for platform, group in groupby(replies, key=lambda reply: reply.platform):
            adapter = adapters.get(platform)
            if adapter is None:
                log.warning("a reply to a %s user, but the %s adapter is not running; not sent", platform, platform)
                continue
            await adapter.deliver(list(group))

    scheduler = CheckinScheduler(runtime, runtime.schedules, deliver, utc_now, runtime.checkin_settings)
    # Sends the outbox's due replies and replays, through each adapter, the
    # events that wait for storage (bot/durable/redelivery.py).
    redelivery = Redelivery(
        runtime.inbox,
        runtime.outbox,
        {name: adapter.deliver for name, adapter in adapters.items()},
        replayers={name: adapter.replay for name, adapter in adapters.items()},
    )

    async def bring_up(name: str, adapter: Adapter) -> None:
        # Missed ticks and replays send at once: wait until this adapter can send. Each
        # adapter on its own: one platform that cannot connect does not hold another's events.
        try:
            await asyncio.wait_for(adapter.wait_ready(), timeout=READY_TIMEOUT)
        except TimeoutError:
            log.warning("%s adapter not ready after %.0f s; replaying its events anyway", name, READY_TIMEOUT)
        # Crash recovery first: the events the last run left unfinished, in
        # order, then the replies it left unconfirmed (redelivery's first round).
        try:
            replayed = await adapter.recover()
        except StoreError as error:
            # Storage is down at start: redelivery replays them once it can read the inbox.
            announce(f"{name}: cannot read the inbox yet ({error}); will replay it when storage answers")
            redelivery.recover_later(name)
            return
        if replayed:
            announce(f"{name}: replayed {replayed} events left unfinished by the last run")

    async def start_scheduler() -> None:
        await asyncio.gather(*(bring_up(name, adapter) for name, adapter in adapters.items()))
        redelivery.start()
        # Check-ins start; while an event waits for storage, the person gets one notice through `deliver`.
        runtime.connect(deliver, scheduler)
        announce("check-ins: scheduler started (missed check-ins within the grace period fire now)")
        await scheduler.start()
        log.info("check-ins: %d schedules armed", len(scheduler.armed()))

    try:
        # The one shutdown: every kind of work in flight drains (bounded) before the adapters close.
        await run_adapters(
            plans, announce, on_started=start_scheduler, settle=lambda: runtime.doors.settle(say=announce)
        )
    finally:
        runtime.connect(None, None)
        await scheduler.stop()
        await redelivery.stop()
        if health is not None:
            await health.close()


async def _start_health(
    runtime: Runtime, adapters: Mapping[str, Adapter], announce: Callable[[str], Any]
) -> HealthServer | None:
    """The /healthz and /metrics server, when MEMGPT_METRICS_PORT is set (cli/health.py)."""
    from cli.health import HealthServer

    settings = runtime.settings
    if not settings.metrics_port:
        return None
    server = HealthServer(runtime, adapters, settings.metrics_host, settings.metrics_port)
    try:
        await server.start()
    except OSError as error:
        raise NoAdapterError(
            f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port} "
            f"(MEMGPT_METRICS_PORT): {error.strerror or error}"
        ) from None
    announce(f"health and metrics: http://{settings.metrics_host}:{server.port}/healthz and /metrics")
    return server


async def run_adapters(
    plans: list[AdapterPlan],
    announce: Callable[[str], Any],
    on_started: Callable[[], Coroutine[Any, Any, None]] | None = None,
    settle: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Start every planned adapter and run until a signal or until all stop.
    `settle`: awaited before the adapters close, to let the events in flight
    finish (their replies still need the connections)."""
    for plan in plans:
        announce(f"{plan.name}: {'starting, ' if plan.adapter else 'skipped: '}{plan.reason}")
    active = [plan for plan in plans if plan.adapter is not None]
    if not active:
        raise NoAdapterError(
            "no chat platform is configured: set DISCORD_TOKEN and/or SLACK_BOT_TOKEN "
            "(with SLACK_APP_TOKEN or SLACK_SIGNING_SECRET); see README"
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or not a Unix loop
            pass
    tasks = {asyncio.create_task(plan.adapter.start(), name=plan.name): plan for plan in active}  # type: ignore[union-attr]
    stopper = asyncio.create_task(stop.wait(), name="stop")
    started = asyncio.create_task(on_started(), name="on-started") if on_started else None
    failures: list[str] = []
    try:
        pending: set[asyncio.Task[Any]] = set(tasks) | {stopper}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if stopper in done:
                break
            for task in done:
                plan = tasks[task]
                error = task.exception() if not task.cancelled() else None
                if error is not None:
                    # Announced (to the console), and in the log file with the others' start lines.
                    log.info("%s adapter stopped: %s", plan.name, error)
                    announce(f"{plan.name}: stopped: {error}")
                    failures.append(f"{plan.name}: {error}")
            if pending == {stopper}:
                break
    finally:
        stopper.cancel()
        if started is not None:
            started.cancel()
        if settle is not None:
            await settle()
        for plan in active:
            try:
                await plan.adapter.close()  # type: ignore[union-attr]
            except Exception:
                log.exception("closing the %s adapter failed", plan.name)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if failures and len(failures) == len(active):
        # Nothing is left running: exit non-zero so a process supervisor notices and restarts.
        raise NoAdapterError("every adapter stopped: " + "; ".join(failures))
