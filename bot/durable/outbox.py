"""The reply outbox: every reply to a durable event is recorded before the
step goes on (Agent.send), reported by its adapter once tried (`report`), and
retried with backoff until sent or dropped (`due`, by bot/durable/redelivery.py).
What a reply has been through (its attempts, its next try) lives in its outbox
row and travels with it (Reply.attempts), never in this process's memory."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from bot.durable.leases import Leases, NoLeases
from bot.events import Delivery, Event, Reply
from memory.store import OutboxEntry, Store, StoreError
from memory.types import utc_now

log = logging.getLogger(__name__)

# Send attempts of one reply before it is dropped (about an hour of backoff).
MAX_SEND_ATTEMPTS = 12
FIRST_RETRY_DELAY = 2.0  # seconds; doubles per attempt
MAX_RETRY_DELAY = 600.0


def retry_delay(attempts: int) -> float:
    return min(FIRST_RETRY_DELAY * 2.0 ** max(attempts - 1, 0), MAX_RETRY_DELAY)


def reply_of(entry: OutboxEntry) -> Reply:
    return Reply(
        entry.text,
        entry.platform,
        entry.user_id,
        entry.reply_to,
        entry.event_id,
        outbox_id=entry.id,
        resend=True,
        attempts=entry.attempts,
    )


def unconfirmed(entries: Iterable[OutboxEntry]) -> list[Reply]:
    """The replies among `entries` not yet confirmed sent (nor dropped), to send again."""
    return [reply_of(entry) for entry in entries if entry.state == "pending"]


def outbox_entry(reply: Reply, position: int) -> OutboxEntry:
    """The outbox record of `reply`, number `position` of those filed under its event id."""
    return OutboxEntry(
        f"{reply.event_id}:{position}",
        reply.event_id,
        position,
        reply.agent_key,
        reply.platform,
        reply.user_id,
        dict(reply.reply_to),
        reply.text,
        utc_now(),
    )


# What an event's notice (not its answer) is filed under, after the event id.
NOTICE_SUFFIX = ":notice"


class Outbox:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time, leases: Leases | None = None) -> None:
        self.store = store
        self.clock = clock
        self.started_at = clock()
        # Several processes: whose the replies of an event are (its inbox row's owner).
        self.leases = leases or NoLeases()

    async def file_notice(self, reply: Reply) -> list[Reply]:
        """A notice about an event (a file saved, an event given up), sent like an
        answer but filed apart from the agent's answers, under the event's id +
        NOTICE_SUFFIX, once: a redo of the event (a kill came between the send and
        the event's end) finds it there. The reply to send now: a new one, or one
        an earlier run filed and never confirmed (marked `resend`: the adapter
        checks before sending it again); none once it was sent."""
        reply.event_id += NOTICE_SUFFIX
        entry = outbox_entry(reply, 0)
        if await self.store.outbox_add(entry):
            reply.outbox_id = entry.id
            return [reply]
        return unconfirmed(await self.store.outbox_for_event(entry.event_id))

    async def report(self, reply: Reply, outcome: Delivery, detail: str = "") -> Delivery:
        """Record how sending one reply went; what became of it (a reply
        failed MAX_SEND_ATTEMPTS times is dropped: UNDELIVERABLE)."""
        if not reply.outbox_id:
            return outcome
        try:
            return await self._record(reply, outcome, detail)
        except StoreError as error:
            # Unrecorded, a sent reply stays pending and is checked for before any resend.
            log.warning("could not record the delivery of reply %s (%s)", reply.outbox_id, error)
            return outcome

    async def _record(self, reply: Reply, outcome: Delivery, detail: str) -> Delivery:
        if outcome is Delivery.SENT:
            await self.store.outbox_update(reply.outbox_id, state="sent")
            return outcome
        if outcome is Delivery.UNDELIVERABLE:
            log.warning(
                "reply %s to %s:%s dropped: %s",
                reply.outbox_id,
                reply.platform,
                reply.user_id,
                detail or "undeliverable",
            )
            await self.store.outbox_update(reply.outbox_id, state="dropped")
            return outcome
        reply.attempts += 1
        if reply.attempts >= MAX_SEND_ATTEMPTS:
            log.error(
                "reply %s to %s:%s dropped after %d failed sends (%s)",
                reply.outbox_id,
                reply.platform,
                reply.user_id,
                reply.attempts,
                detail or "send failed",
            )
            await self.store.outbox_update(reply.outbox_id, state="dropped", attempts=reply.attempts)
            return Delivery.UNDELIVERABLE
        delay = retry_delay(reply.attempts)
        log.info(
            "reply %s to %s:%s not sent (%s); retry %d in %.0f s",
            reply.outbox_id,
            reply.platform,
            reply.user_id,
            detail or "send failed",
            reply.attempts,
            delay,
        )
        await self.store.outbox_update(
            reply.outbox_id, state="pending", attempts=reply.attempts, next_try_at=self.clock() + delay
        )
        return outcome

    async def due(self, platform: str) -> list[Reply]:
        """Replies the retrier should send now: failed ones whose backoff is
        over, and those a previous run left unconfirmed (never one in flight
        in this run for the first time)."""
        entries = await self.store.outbox_pending(platform, due_by=self.clock())
        return [
            reply_of(entry)
            for entry in entries
            if (entry.attempts > 0 or entry.created_at.timestamp() < self.started_at) and await self._ours(entry)
        ]

    async def _ours(self, entry: OutboxEntry) -> bool:
        """Whether the retrier of this process is the one to send `entry`
        (several processes on one database; a single one sends everything).
        While its event is unfinished, none: the event's run sends it (its
        owner's, or, the owner dead, the redo of whoever takes the event
        over; a redo already under way here must not race this round). Once
        the event is done: the process that owns its inbox row, or, that
        owner dead, the one process that takes the row over (inbox_claim)."""
        if isinstance(self.leases, NoLeases):
            return True
        row = await self.store.inbox_entry(entry.event_id.removesuffix(NOTICE_SUFFIX))
        if row is None:
            return True  # swept a day after it finished: nobody else is sending it
        if row.state != "done":
            return False
        if self.leases.mine(row.owner):
            return True
        if row.owner in await self.leases.live({row.owner}):
            return False
        return await self.store.inbox_claim(row.event_id, row.owner, await self.leases.owner())


async def seen_by_a_later_run(store: Store, agent_id: str, event: Event) -> bool:
    """Whether the message of `event`, recorded and never answered, was shown
    to the model by a later event's run since: another event's message was
    recorded after it, and a step after that; or (a durable event) a reply
    was sent after it. A redo would answer a message the conversation has
    moved past. (With several processes, a newer event of the person can run
    before a killed process's older one is taken over, and the older one's
    message can even be recorded after the newer one's, by a run killed
    before it answered: the newer one's redo then answered both.)"""
    seq = await store.event_message_seq(agent_id, event.event_id)
    if seq is None:
        return False
    own = {member.event_id for member in event.members()}
    another = False
    for message in await store.messages_since(agent_id, seq + 1, place=event.place.key):
        if event.replies_in_outbox and message.role == "assistant" and message.calls("send_message"):
            # A send step is stored with its outbox entry (Agent.send), and this
            # event has none (the caller looked): another event's run sent it.
            return True
        if message.role == "user" and message.event_id and message.event_id not in own:
            # A replayed batch leader comes without its followers (replays are not
            # debounced), but their messages were recorded with it: they are its own.
            entry = await store.inbox_entry(message.event_id)
            if entry is not None and entry.absorbed_into == event.event_id:
                own.add(message.event_id)
                continue
            another = True
        elif another and message.role == "assistant":
            return True
    return False
