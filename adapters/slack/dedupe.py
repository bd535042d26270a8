"""Slack's retried deliveries, recognised for a bot without an event journal.
A bot with one (the runtime) recognises repeats by the journal's key, in every
process (bot/durable/); simpler bots (tests) use these."""

from __future__ import annotations

from typing import Protocol

from adapters.lru import LRU


class EventDeduper(Protocol):
    """Remembers delivered Events API ids, so Slack's retries are answered once."""

    async def seen(self, event_id: str) -> bool:
        """Whether `event_id` was seen before; records it if not."""
        ...


class RecentEventIds:
    """The default deduper: the last `capacity` event ids, in memory. Slack retries
    within minutes, so a few thousand ids cover any burst of retries."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._ids: LRU[str, bool] = LRU(capacity)

    async def seen(self, event_id: str) -> bool:
        if event_id in self._ids:
            return True
        self._ids.put(event_id, True)
        return False
