"""Store faults: events wait out a busy, full or unreachable database.

An event that meets a StoreError (SQLite busy or locked past its busy
timeout, a full disk, MongoDB unreachable, a lease lost with it) is redone
whole after a pause that doubles from 0.5 s up to 8 s, until
MEMGPT_STORE_WAIT seconds after it arrived. Redoing is safe (bot/durable/__init__.py):
a durable event's message is recorded once (Message.event_id) and its replies
once (the outbox); the runtime drops its cached agent before each redo,
since a failed write can leave that copy ahead of the store.

- Order: it runs inside the agent's turn (bot/door.py), held across attempts,
  so their later events wait behind this one. The lease is let go between
  attempts (another process may go ahead meanwhile).
- The person: after the first failed attempt at a message or upload they get
  one notice (TROUBLE_NOTICE) through `notify`, which `memgpt-bot run` wires
  to the adapters' deliver (cli/app.py). Replies only leave at the end of an
  event, so the notice cannot travel with them. One per user until storage
  answers again, however many of their events wait.
- Giving up: the result is `unfinished`, and its trouble text says what
  happens next. A durable event's journal row says it waits, with its next
  try (Inbox.wait_for_storage: the adapter's `finished` leaves it so), and it
  is replayed in this run once due or once storage answers (Redelivery), or
  at the next start. The person is told
  so once per outage. A non-durable event was never kept, so its sender is
  asked to send it again, every time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from bot.agent import ANSWERED_KINDS, EventResult
from bot.durable.inbox import Inbox
from bot.durable.leases import LeaseLostError
from bot.durable.redelivery import Sender
from bot.events import Event
from memory.store import StoreError

log = logging.getLogger(__name__)

FIRST_DELAY = 0.5  # seconds before the first redo; doubles per attempt...
MAX_DELAY = 8.0  # ...up to this
TROUBLE_NOTICE = "I'm having trouble saving right now; I'll answer as soon as I can."
KEPT_MESSAGE = (
    "I can't reach my memory storage right now. I got your message and will answer it as soon as my storage is back."
)
LOST_MESSAGE = (
    "I can't reach my memory storage right now, so I couldn't take your message in. "
    "Please send it again in a few minutes."
)

Attempt = Callable[[], Awaitable[EventResult]]


class StoreWait:
    def __init__(
        self,
        inbox: Inbox,
        wait: float,
        *,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inbox = inbox
        self.wait = wait  # MEMGPT_STORE_WAIT
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.clock = clock
        # Sends replies that answer no event (set by `memgpt-bot run`); None: no interim notice.
        self.notify: Sender | None = None
        self._noticed: set[str] = set()  # users sent TROUBLE_NOTICE since storage last answered
        self._told: set[str] = set()  # users told KEPT_MESSAGE since storage last answered

    async def run(self, event: Event, attempt: Attempt) -> EventResult:
        """`attempt()` until it gets through the store or the wait is over."""
        key = event.agent_key
        # Counted from the event's first try, in its turn (bot/door.py): the
        # person's later events wait behind it, each for its own wait at most.
        deadline = self.clock() + self.wait
        delay = self.first_delay
        tries = 0
        while True:
            tries += 1
            try:
                result = await attempt()
            except StoreError as error:
                left = deadline - self.clock()
                if left <= 0:
                    return await self._give_up(event, error, tries)
                pause = min(delay, left)
                log.warning(
                    "event %s of %s: storage failed (%s); trying again in %.1f s", event.event_id, key, error, pause
                )
                if not isinstance(error, LeaseLostError):  # redone at once under a new heartbeat: nothing to tell
                    await self._notice(event)
                await asyncio.sleep(pause)
                delay = min(delay * 2, self.max_delay)
                continue
            if tries > 1:
                log.info("event %s of %s went through after %d attempts", event.event_id, key, tries)
            self._noticed.discard(key)
            self._told.discard(key)
            # Storage answers: events deferred earlier need not wait for their timer.
            self.inbox.storage_answered()
            return result

    async def _notice(self, event: Event) -> None:
        key = event.agent_key
        # Only someone waiting for an answer is told (not a join, nor a check-in tick).
        if self.notify is None or event.kind not in ANSWERED_KINDS or key in self._noticed:
            return
        self._noticed.add(key)
        try:
            await self.notify([event.reply(TROUBLE_NOTICE)])
        except Exception:  # a notice that cannot be sent must not stop the wait
            log.exception("could not send the storage-trouble notice to %s", key)

    async def _give_up(self, event: Event, error: StoreError, tries: int) -> EventResult:
        key, kept = event.agent_key, event.in_inbox
        log.error(
            "event %s of %s: storage unreachable for %.0f s (%d attempts; last: %s); %s",
            event.event_id,
            key,
            self.wait,
            tries,
            error,
            "it stays pending in the journal for a replay" if kept else "it was not kept",
        )
        if kept:
            await self.inbox.wait_for_storage(event)
        text = KEPT_MESSAGE if kept else LOST_MESSAGE
        result = EventResult(trouble=text, unfinished=True)
        if event.kind in ANSWERED_KINDS and not (kept and key in self._told):
            # Not through the outbox: it lives in the very store that fails.
            result.replies = [event.reply(text)]
            if kept:
                self._told.add(key)
        return result
