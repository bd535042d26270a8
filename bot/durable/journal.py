"""Crash safety: the inbound event journal and the reply outbox.

The protocol, end to end (a SIGKILL may land anywhere in it):

1. An adapter records each platform event (`receive`) before it acknowledges
   it; a repeat delivery of a recorded event is acknowledged and dropped.
2. The agent records the event's message in recall storage tagged with the
   event id, and every reply it sends in the outbox (Agent.send) before the
   step goes on. Redone after a crash, an event whose message is there is
   not recorded again; one that was answered is not answered again: only its
   unconfirmed replies are handed back (Agent._answered_before_a_crash).
3. The adapter sends each reply and reports how it went (`report`): sent, to
   retry later (with backoff, by `OutboxRetrier`), or undeliverable (the
   person left or blocked the bot: dropped with a log line). Then it marks
   the event done (`finished`).
4. At start, before new work, each adapter replays its pending events in
   arrival order (`pending`); then the retrier sends what is left unconfirmed.

A reply that reached the platform just before a crash, but was not yet
confirmed, comes back marked `resend`: the adapter looks for it on the
platform before sending it again (Slack: message metadata; Discord: nonce).

Storage down (bot/durable/store_wait.py): an event that gave up waiting for the
store is `defer`red by the runtime. The adapter's `finished` then leaves its
entry pending (an entry is held back when any of its events, "<id>" or
"<id>:<n>", was deferred), and `pending` hands it back for a replay through
the adapter's own recover path: after the first call (the start-up replay),
`pending` returns only deferred entries that are due, REPLAY_AFTER seconds
after they gave up, or at once when storage answers again. The OutboxRetrier
starts those replays. Only this process's memory knows an entry is deferred,
which is enough: its own entries are not replayed behind its back, and after
a restart every pending entry is replayed anyway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bot.events import Delivery, Event, Reply, agent_key
from bot.sanitize import fix_surrogates_in
from memory.store import JournalEntry, OutboxEntry, Store, StoreError
from memory.types import utc_now

log = logging.getLogger(__name__)

# A pending event is replayed at most this many times: an event that crashes
# the bot every time must not keep it from ever starting.
MAX_REPLAYS = 5
# Send attempts of one reply before it is dropped (about an hour of backoff).
MAX_SEND_ATTEMPTS = 12
FIRST_RETRY_DELAY = 2.0  # seconds; doubles per attempt
MAX_RETRY_DELAY = 600.0
RETRY_POLL = 2.0  # seconds between looks at the outbox
# A deferred event (storage was down) is replayed this many seconds after it
# gave up, or as soon as storage answers another event.
REPLAY_AFTER = 60.0
# Replays of one deferred entry in one run: storage down for hours, or an
# event whose every write fails, must not hold its user's line forever. It
# stays pending in the journal for the next start.
MAX_DEFERRALS = 50
FORGET_DEFERRED_AFTER = 3_600.0  # seconds: a deferred event no adapter ever finished (a check-in tick)


def retry_delay(attempts: int) -> float:
    return min(FIRST_RETRY_DELAY * 2 ** max(attempts - 1, 0), MAX_RETRY_DELAY)


def reply_of(entry: OutboxEntry) -> Reply:
    return Reply(
        entry.text, entry.origin, entry.user_id, entry.reply_to, entry.event_id, outbox_id=entry.id, resend=True
    )


def unconfirmed(entries: Iterable[OutboxEntry]) -> list[Reply]:
    """The replies among `entries` not yet confirmed sent (nor dropped), to send again."""
    return [reply_of(entry) for entry in entries if entry.state == "pending"]


def outbox_entry(event: Event, text: str, position: int, *, filed_under: str | None = None) -> OutboxEntry:
    """The outbox record of reply number `position` to `event`, filed under
    the event's id (or `filed_under`, for a notice kept apart from its answers)."""
    event_id = filed_under or event.event_id
    return OutboxEntry(
        f"{event_id}:{position}",
        event_id,
        position,
        event.agent_key,
        event.platform,
        event.user_id,
        dict(event.reply_to),
        text,
        utc_now(),
    )


@dataclass(slots=True)
class _Deferred:
    origin: str
    at: float  # deferred at (clock), or when the replay is due


class Journal:
    def __init__(
        self, store: Store, clock: Callable[[], float] = time.time, replay_after: float = REPLAY_AFTER
    ) -> None:
        self.store = store
        self.clock = clock
        self.started_at = clock()
        self.replay_after = replay_after
        self._attempts: dict[str, int] = {}  # outbox id -> send attempts so far
        self._deferred: dict[str, _Deferred] = {}  # event id -> gave up, its adapter not yet finished
        self._waiting: dict[str, _Deferred] = {}  # journal entry id -> to replay, when due
        self._deferrals: dict[str, int] = {}  # journal entry id -> times deferred in this run
        self._recovered: set[str] = set()  # origins whose start-up replay has read the journal

    async def receive(self, origin: str, event_id: str, user_id: str, payload: dict[str, Any]) -> bool:
        """Record an inbound event; False for a repeat delivery. Raises
        StoreError when it cannot be recorded: the adapter must then not
        acknowledge it (the platform delivers it again)."""
        # A payload may spell lone surrogates ("\ud800" in Slack's JSON): no store can hold those.
        entry = JournalEntry(event_id, origin, agent_key(origin, user_id), fix_surrogates_in(payload), utc_now())
        return await self.store.journal_receive(entry)

    def defer(self, event: Event) -> None:
        """The runtime gave up on `event`: storage could not be reached. Its
        journal entry stays pending (`finished` leaves it) for a replay."""
        now = self.clock()
        for stale in [key for key, item in self._deferred.items() if item.at < now - FORGET_DEFERRED_AFTER]:
            del self._deferred[stale]
        self._deferred[event.event_id] = _Deferred(event.platform, now)

    def storage_answered(self) -> None:
        """An event got through the store: deferred entries are due now."""
        now = self.clock()
        for item in self._waiting.values():
            item.at = min(item.at, now)

    def replay_due(self, origin: str) -> bool:
        """Whether `pending(origin)` has something to replay now (the start-up
        replay counts until it could read the journal)."""
        now = self.clock()
        return origin not in self._recovered or any(
            item.origin == origin and item.at <= now for item in self._waiting.values()
        )

    def _hold_back(self, event_id: str) -> bool:
        """True if the entry had an event deferred: it is kept for a replay."""
        gave_up = [key for key in self._deferred if key == event_id or key.startswith(event_id + ":")]
        if not gave_up:
            return False
        origin = self._deferred[gave_up[0]].origin
        for key in gave_up:
            del self._deferred[key]
        count = self._deferrals[event_id] = self._deferrals.get(event_id, 0) + 1
        if count > MAX_DEFERRALS:
            log.error(
                "event %s deferred %d times (storage down, or every write of it fails); left pending "
                "for the next start",
                event_id,
                count - 1,
            )
            return True
        self._waiting[event_id] = _Deferred(origin, self.clock() + self.replay_after)
        log.warning(
            "event %s waits for storage; replayed in %.0f s, or once storage answers", event_id, self.replay_after
        )
        return True

    async def finished(self, event_id: str) -> None:
        if self._hold_back(event_id):
            return
        try:
            await self.store.journal_update(event_id, state="done")
        except StoreError as error:
            # The replies are out; at worst a restart replays it and finds them sent.
            log.warning("could not mark event %s done (%s); a restart will re-check it", event_id, error)

    async def pending(self, origin: str) -> list[dict[str, Any]]:
        """Payloads of the events to replay, in arrival order. The first call
        (at start): every event a crash left unfinished; each replay counts,
        and one replayed MAX_REPLAYS times is given up. Later calls: the
        deferred events that are due (storage was down), not counted."""
        if origin in self._recovered:
            return await self._due_replays(origin)
        payloads = await self._crash_leftovers(origin)
        self._recovered.add(origin)
        return payloads

    async def _due_replays(self, origin: str) -> list[dict[str, Any]]:
        now = self.clock()
        due = [key for key, item in self._waiting.items() if item.origin == origin and item.at <= now]
        if not due:
            return []
        for key in due:  # should storage still fail, look again later, not at every poll
            self._waiting[key].at = now + self.replay_after
        entries = await self.store.journal_pending(origin)
        for key in due:  # those no longer pending were finished meanwhile, or forgotten
            del self._waiting[key]
        payloads = [entry.payload for entry in entries if entry.event_id in due]
        if payloads:
            log.info("%s: replaying %d events that waited for storage", origin, len(payloads))
        return payloads

    async def _crash_leftovers(self, origin: str) -> list[dict[str, Any]]:
        payloads = []
        heads: set[str] = set()
        for entry in await self.store.journal_pending(origin):
            # Each user's events run one at a time, in order: only the first
            # pending one of a user can have been in progress at the crash.
            if entry.agent_key not in heads:
                heads.add(entry.agent_key)
                if entry.attempts >= MAX_REPLAYS:
                    log.error(
                        "giving up on %s event %s of %s: the bot stopped %d times while handling it",
                        origin,
                        entry.event_id,
                        entry.agent_key,
                        entry.attempts,
                    )
                    await self.store.journal_update(entry.event_id, state="done")
                    heads.discard(entry.agent_key)  # the next one heads the line now
                    continue
                await self.store.journal_update(entry.event_id, attempts=entry.attempts + 1)
            payloads.append(entry.payload)
        if payloads:
            log.info("%s: replaying %d events left unfinished by the last run", origin, len(payloads))
        return payloads

    async def report(self, reply: Reply, outcome: Delivery, detail: str = "") -> None:
        """Record how sending one reply went."""
        if not reply.outbox_id:
            return
        if outcome is Delivery.SENT:
            await self.store.outbox_update(reply.outbox_id, state="sent")
            self._attempts.pop(reply.outbox_id, None)
            return
        if outcome is Delivery.UNDELIVERABLE:
            log.warning(
                "reply %s to %s:%s dropped: %s",
                reply.outbox_id,
                reply.platform,
                reply.user_id,
                detail or "undeliverable",
            )
            await self.store.outbox_update(reply.outbox_id, state="dropped")
            self._attempts.pop(reply.outbox_id, None)
            return
        attempts = await self._attempts_of(reply) + 1
        if attempts >= MAX_SEND_ATTEMPTS:
            log.error(
                "reply %s to %s:%s dropped after %d failed sends (%s)",
                reply.outbox_id,
                reply.platform,
                reply.user_id,
                attempts,
                detail or "send failed",
            )
            await self.store.outbox_update(reply.outbox_id, state="dropped", attempts=attempts)
            self._attempts.pop(reply.outbox_id, None)
            return
        delay = retry_delay(attempts)
        log.info(
            "reply %s to %s:%s not sent (%s); retry %d in %.0f s",
            reply.outbox_id,
            reply.platform,
            reply.user_id,
            detail or "send failed",
            attempts,
            delay,
        )
        self._attempts[reply.outbox_id] = attempts
        await self.store.outbox_update(
            reply.outbox_id, state="pending", attempts=attempts, next_try_at=self.clock() + delay
        )

    async def _attempts_of(self, reply: Reply) -> int:
        known = self._attempts.get(reply.outbox_id)
        if known is not None:
            return known
        entries = await self.store.outbox_for_event(reply.event_id)
        return next((entry.attempts for entry in entries if entry.id == reply.outbox_id), 0)

    async def due(self, origin: str) -> list[Reply]:
        """Replies the retrier should send now: failed ones whose backoff is
        over, and those a previous run left unconfirmed (never one in flight
        in this run for the first time)."""
        entries = await self.store.outbox_pending(origin, due_by=self.clock())
        due = [entry for entry in entries if entry.attempts > 0 or entry.created_at.timestamp() < self.started_at]
        for entry in due:
            self._attempts[entry.id] = entry.attempts
        return [reply_of(entry) for entry in due]


Sender = Callable[[list[Reply]], Awaitable[None]]
Replayer = Callable[[], Awaitable[int]]  # an adapter's `recover`: replays what `pending` returns


class OutboxRetrier:
    """Sends the outbox's due replies through each platform's adapter, and
    starts the adapter's replay of events deferred while storage was down,
    until stopped."""

    def __init__(
        self,
        journal: Journal,
        senders: dict[str, Sender],
        poll: float = RETRY_POLL,
        replayers: Mapping[str, Replayer] | None = None,
    ) -> None:
        self.journal = journal
        self.senders = senders
        self.poll = poll
        self.replayers = dict(replayers or {})
        self._task: asyncio.Task[None] | None = None
        self._replays: dict[str, asyncio.Task[int]] = {}

    async def run_once(self, origins: Iterable[str] | None = None) -> int:
        sent = 0
        for origin in origins or list(self.senders):
            try:
                replies = await self.journal.due(origin)
            except StoreError as error:
                log.warning("outbox: cannot read pending %s replies (%s); will try again", origin, error)
                continue
            if replies:
                await self.senders[origin](replies)
                sent += len(replies)
        self.replay_deferred()
        return sent

    def replay_deferred(self) -> None:
        """Start the replay of each platform with deferred events due. In the
        background: a replay may wait for storage again, and sends go on."""
        for origin, replay in self.replayers.items():
            running = self._replays.get(origin)
            if (running is None or running.done()) and self.journal.replay_due(origin):
                task = self._replays[origin] = asyncio.create_task(replay(), name=f"replay-{origin}")
                task.add_done_callback(lambda done, origin=origin: self._replayed(origin, done))

    @staticmethod
    def _replayed(origin: str, task: asyncio.Task[int]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            # Still pending in the journal: the next round (or start) tries again.
            log.warning("%s: replaying deferred events failed (%s); will try again", origin, error)
        elif task.result():
            log.info("%s: replayed %d deferred events", origin, task.result())

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="outbox-retrier")

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # never let one bad reply stop every later retry
                log.exception("outbox: retry round failed")
            await asyncio.sleep(self.poll)

    async def stop(self) -> None:
        tasks = [task for task in (self._task, *self._replays.values()) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._replays.clear()
