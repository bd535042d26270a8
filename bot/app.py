"""`memgpt-bot run`: every configured platform adapter in one process, sharing
one runtime. Says which adapters started and which were skipped, and why."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bot.ports import BotPort

log = logging.getLogger(__name__)


class Adapter(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class AdapterPlan:
    name: str
    adapter: Adapter | None
    reason: str  # why it starts (its mode) or why it was skipped


class NoAdapterError(Exception):
    """No platform has credentials configured."""


def _discord(bot: BotPort, env: Mapping[str, str]) -> AdapterPlan:
    from adapters.discord_adapter import DiscordAdapter, DiscordConfig

    config = DiscordConfig.from_env(env)
    if config is None:
        return AdapterPlan("discord", None, "DISCORD_TOKEN is not set")
    sharding = f", sharded ({env.get('DISCORD_SHARD_COUNT')})" if env.get("DISCORD_SHARD_COUNT") else ""
    return AdapterPlan("discord", DiscordAdapter(bot, config), f"gateway connection{sharding}")


def _slack(bot: BotPort, env: Mapping[str, str]) -> AdapterPlan:
    from adapters.slack_adapter import SlackAdapter, SlackConfig

    try:
        config = SlackConfig.from_env(env)
    except ValueError as error:
        return AdapterPlan("slack", None, str(error))
    if config is None:
        return AdapterPlan("slack", None, "SLACK_BOT_TOKEN is not set")
    if env.get("SLACK_APP_TOKEN"):
        mode = "Socket Mode (SLACK_APP_TOKEN)"
    else:
        host, port = env.get("SLACK_HTTP_HOST", "0.0.0.0"), env.get("SLACK_HTTP_PORT", "3000")
        mode = f"HTTP mode on {host}:{port}/slack/events (SLACK_SIGNING_SECRET)"
    return AdapterPlan("slack", SlackAdapter(bot, config), mode)


PLANNERS: dict[str, Callable[[BotPort, Mapping[str, str]], AdapterPlan]] = {"discord": _discord, "slack": _slack}


def plan_adapters(bot: BotPort, env: Mapping[str, str] | None = None) -> list[AdapterPlan]:
    env = os.environ if env is None else env
    return [planner(bot, env) for planner in PLANNERS.values()]


async def run_adapters(plans: list[AdapterPlan], announce: Callable[[str], Any]) -> None:
    """Start every planned adapter and run until a signal or until all stop."""
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
                    log.error("%s adapter stopped: %s", plan.name, error)
                    announce(f"{plan.name}: stopped: {error}")
            if pending == {stopper}:
                break
    finally:
        stopper.cancel()
        for plan in active:
            try:
                await plan.adapter.close()  # type: ignore[union-attr]
            except Exception:
                log.exception("closing the %s adapter failed", plan.name)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
