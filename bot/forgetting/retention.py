"""Channel memory retention (MEMGPT_CHANNEL_RETENTION_DAYS): every channel's
lines older than that many days are deleted, by a sweep every SWEEP_EVERY
while `memgpt-bot run` is up (Runtime.connect starts it, with the check-in
scheduler and redelivery; it stops with them).

A timer rather than a sweep riding on traffic, as the inbox's and the usage
counters' do: those only hold what traffic brings and only matter to it,
while a retention period is a promise to the members of a quiet channel too.
Several processes on one store each sweep: a deletion by date is the same
whoever makes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta

from memory.channels import ChannelMemory
from memory.store import StoreError

log = logging.getLogger(__name__)

SWEEP_EVERY = timedelta(hours=1)


class ChannelRetention:
    def __init__(self, memory: ChannelMemory, days: int, every: timedelta = SWEEP_EVERY) -> None:
        self.memory = memory
        self.keep_for = timedelta(days=days) if days > 0 else None  # None: kept until forgotten
        self.every = every
        self._task: asyncio.Task[None] | None = None

    async def sweep(self, now: datetime | None = None) -> int:
        """Delete the lines older than the retention period; how many went (0 when there is none)."""
        if self.keep_for is None:
            return 0
        try:
            removed = await self.memory.prune(self.keep_for, now)
        except StoreError as error:  # housekeeping: the next sweep tries again
            log.warning("could not sweep channel memories: %s", error)
            return 0
        if removed:
            log.info("channel memories: deleted %d lines older than %d days", removed, self.keep_for.days)
        return removed

    def start(self) -> None:
        if self.keep_for is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="channel-retention")

    def cancel(self) -> asyncio.Task[None] | None:
        """Stop sweeping; the task, to await where the caller can."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def stop(self) -> None:
        task = self.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await self.sweep()
            await asyncio.sleep(self.every.total_seconds())
