"""Redelivery: the one loop that, every few seconds, sends each platform's
due replies from the outbox (failed ones after their backoff, held ones behind
them, those a previous run left unconfirmed) and replays, through the
platform's adapter, the events whose inbox row says they wait for storage
and are due, and those of other bot processes that died (Inbox.orphans). A
platform whose start-up replay could not read the inbox (storage down at
start) has it done here once storage answers."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from bot.durable.inbox import Inbox
from bot.durable.outbox import Outbox
from bot.events import Redo, Reply
from memory.store import StoreError

log = logging.getLogger(__name__)

RETRY_POLL = 2.0  # seconds between rounds

Sender = Callable[[list[Reply]], Awaitable[None]]  # an adapter's `deliver`
Replayer = Callable[[list[Redo]], Awaitable[int]]  # an adapter's `replay`: handles them again, in order


class Redelivery:
    def __init__(
        self,
        inbox: Inbox,
        outbox: Outbox,
        senders: Mapping[str, Sender],
        replayers: Mapping[str, Replayer] | None = None,
        poll: float = RETRY_POLL,
    ) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.senders = dict(senders)
        self.replayers = dict(replayers or {})
        self.poll = poll
        self._task: asyncio.Task[None] | None = None
        self._replays: dict[str, asyncio.Task[int]] = {}
        self._leftovers_unread: set[str] = set()

    def recover_later(self, platform: str) -> None:
        """The start-up replay of `platform` could not read the inbox: do it once storage answers."""
        self._leftovers_unread.add(platform)

    async def run_once(self, platforms: Iterable[str] | None = None) -> int:
        """One round: send the due replies, then start due replays. How many replies went."""
        sent = 0
        for platform in platforms or list(self.senders):
            try:
                replies = await self.outbox.due(platform)
            except StoreError as error:
                log.warning("outbox: cannot read pending %s replies (%s); will try again", platform, error)
                continue
            if replies:
                await self.senders[platform](replies)
                sent += len(replies)
        self.replay_due()
        return sent

    def replay_due(self) -> None:
        """Start each platform's replay of its due events. In the background:
        a replay may wait for storage again, and sends go on meanwhile."""
        for platform, replay in self.replayers.items():
            running = self._replays.get(platform)
            if running is None or running.done():
                task = asyncio.create_task(self._replay(platform, replay), name=f"replay-{platform}")
                task.add_done_callback(functools.partial(_replayed, platform))
                self._replays[platform] = task

    async def _replay(self, platform: str, replay: Replayer) -> int:
        try:
            if platform in self._leftovers_unread:
                redos = await self.inbox.leftovers(platform)
                self._leftovers_unread.discard(platform)
            else:
                # Rows of processes that died (several on one database), then those storage failed.
                redos = await self.inbox.orphans(platform) + await self.inbox.due(platform)
        except StoreError as error:  # still down: the next round looks again
            log.info("%s: cannot read the inbox (%s); will try again", platform, error)
            return 0
        return await replay(redos) if redos else 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="redelivery")

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # never let one bad reply stop every later retry
                log.exception("redelivery: round failed")
            await asyncio.sleep(self.poll)

    async def stop(self) -> None:
        tasks = [task for task in (self._task, *self._replays.values()) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._replays.clear()


def _replayed(platform: str, task: asyncio.Task[int]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        # Still unfinished in the inbox: the next round (or start) tries again.
        log.warning("%s: replaying events failed (%s); will try again", platform, error)
    elif task.result():
        log.info("%s: replayed %d events", platform, task.result())
