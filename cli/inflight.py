"""The work in flight when `memgpt-bot run` is told to stop, so that shutdown can
wait for it (with a bound) before it closes the store.

Without the wait, SIGTERM right after a reply closed the store under the event
that sent it (`could not mark event ... done (SQLite store ... is not open)`);
the next start re-checked the reply. Discord's client, unlike Slack's adapter,
does not wait for its handlers when it closes.

`InFlight` stands between the adapters and the bot (it is what they see as the
bot, like cli/health.py's MeteredBot): every call into the bot is counted while
it runs, and every event the journal took as new (`receive` True) is open until
its `finished`, so the replies sent between the two are covered too.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from bot.ports import BotPort

log = logging.getLogger(__name__)

# Seconds shutdown waits for events in flight: below Docker's 10 s stop timeout, after
# which the process is killed anyway (the journal then redoes what was cut short).
SHUTDOWN_GRACE = 8.0


class InFlight:
    """The bot, keeping track of the calls and events in progress."""

    def __init__(self, bot: BotPort) -> None:
        self._bot = bot
        self._open: dict[object, asyncio.Event] = {}  # event ids (received, not finished) and running calls

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._bot, name)
        if not inspect.iscoroutinefunction(found):
            return found

        @functools.wraps(found)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            return await self._while(found(*args, **kwargs))

        return counted

    async def receive(self, platform: str, event_id: str, user_id: str, payload: dict[str, Any]) -> bool:
        fresh = bool(await self._while(self._bot.receive(platform, event_id, user_id, payload)))
        if fresh:
            self._open.setdefault(("event", event_id), asyncio.Event())
        return fresh

    async def finished(self, event_id: str) -> None:
        try:
            await self._while(self._bot.finished(event_id))
        finally:
            done = self._open.pop(("event", event_id), None)
            if done is not None:
                done.set()

    async def _while(self, call: Coroutine[Any, Any, Any]) -> Any:
        token, done = object(), asyncio.Event()
        self._open[token] = done
        try:
            return await call
        finally:
            del self._open[token]
            done.set()

    @property
    def busy(self) -> int:
        return len(self._open)

    async def settle(self, within: float = SHUTDOWN_GRACE, *, say: Callable[[str], Any] | None = None) -> int:
        """Wait, at most `within` seconds, for what is in flight now (not for events that
        arrive meanwhile); how many were still running when the wait ended."""
        waiting = [done for done in self._open.values() if not done.is_set()]
        if not waiting:
            return 0
        if say is not None:
            say(f"stopping: waiting up to {within:.0f} s for {len(waiting)} events and calls in flight")
        _, pending = await asyncio.wait([asyncio.create_task(done.wait()) for done in waiting], timeout=within)
        for task in pending:
            task.cancel()
        if pending:
            log.warning(
                "%d still in flight after %.0f s; the journal redoes them at the next start", len(pending), within
            )
        return len(pending)
