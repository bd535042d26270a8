"""Platform event de-duplication shared by every bot process on one database.

Slack re-delivers an event it thinks was not acknowledged (and with several
Socket Mode connections a retry can reach another process), so the record of
delivered event ids must live in the database, not in one process's memory.
`StoreDeduper` gives the Slack adapter's `EventDeduper` interface
(adapters/slack_support.py: `async seen(event_id) -> bool`, True for a
repeat) on top of `Store.first_delivery` (True for a first delivery).
"""

from __future__ import annotations

import logging

from memory.store import Store, StoreError

log = logging.getLogger(__name__)


class StoreDeduper:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def seen(self, event_id: str) -> bool:
        """Whether `event_id` was delivered before, to any process; records it if not."""
        try:
            return not await self.store.first_delivery(event_id)
        except StoreError as error:
            # Answering a retry twice beats dropping a message nobody answered.
            log.warning("event de-duplication unavailable (%s); handling event %s", error, event_id)
            return False
