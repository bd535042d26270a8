"""Debounce: quick messages from one person in one place become one event.

Someone who types three short lines in a row should get one answer that takes
all three into account, not three answers. So the messages a person sends in
one place within MEMGPT_DEBOUNCE_SECONDS of the previous one form a *burst*:
the window starts again with each new message, up to CAP_FACTOR windows after
the first (a chatty person still gets answers) and MAX_MEMBERS messages.

Where it sits. The burst forms in the adapters, as messages arrive and
before they take the person's lane (bot/durable/lanes.py): an adapter holds
that lane from building an event to delivering its replies, so while one
message waited in the runtime the next could never reach it. The first
message of a burst (its *leader*) takes the lane; the others join the burst
and take no place in line of their own. Holding the lane, the leader waits
for the window to close (`Debouncer.gather`), builds every member's event,
and, when they are all plain messages of the same person and place, hands
the runtime the leader with the others as its `followers` (`merge`): one
event for the lanes, the lease, the quarantine and the outbox. Whatever
cannot merge (a file, a join, two places) is handled member by member, in
arrival order, as before. Replays (redos after a crash, events that waited
for storage) are never debounced.

Crash safety (bot/durable/__init__.py tells the protocol). Every member is in
the inbox (received) before the burst is handled. When the batch's work
starts, the followers' inbox rows are linked to the leader's
(Inbox.started: InboxEntry.absorbed_into); then all the messages are
recorded in ONE write, each tagged with its own event id
(Agent.record_event_message); the steps run once; the replies go to the
outbox under the leader's id; then every member is finished. A SIGKILL
anywhere in between: the leader is redone as any event (recorded and
answered: its unconfirmed replies are sent again; recorded only: the steps
run again, the followers' messages already in the queue). A follower is
redone alone: if its message was recorded with the batch, the leader's run
answers it (or did), so it is finished without an answer
(Inbox.answered_with_its_batch); if not, the batch never got that far and it
is handled as an event of its own, unlinked from the batch first (else a death
in its own run, after recording its message, would read as the batch's).
Nothing lost, nothing answered twice.

A batch meets what another run did (`split_batch`, under the agent's lease,
before the followers are linked). Its leader may have been recorded alone
(an earlier run of the leader by itself, a replay after a crash), or a
follower on its own: the batch's one write cannot take those followers any
more (it records the leader's members only if the leader is new). So a
follower whose recorded state differs from the leader's is taken off the
batch and handled alone after it: a follower's batch either records it or
it is handled alone, never finished as part of a batch that skipped it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from bot.events import Event, Reply, UserMessage
from memory.roles import MessageStore

CAP_FACTOR = 4.0  # a burst closes at most this many windows after its first message
MAX_MEMBERS = 10  # ... or once it holds this many messages

T = TypeVar("T")


@dataclass(eq=False)
class Burst(Generic[T]):
    """Messages of one person in one place, the first its leader."""

    members: list[T]
    first_at: float
    last_at: float
    closed: bool = False

    @property
    def leader(self) -> T:
        return self.members[0]


@dataclass
class Debouncer(Generic[T]):
    """The open bursts of one adapter, by key (person and place). `window`
    0 turns debouncing off: every message is a burst of its own."""

    window: float
    clock: Callable[[], float] = time.monotonic
    cap_factor: float = CAP_FACTOR
    max_members: int = MAX_MEMBERS
    _open: dict[str, Burst[T]] = field(default_factory=dict)

    def join(self, key: str, member: T) -> Burst[T] | None:
        """Take a message as it arrives (no await: arrival order holds). None:
        it joined the open burst of `key`, whose leader handles it. Else the
        new burst it leads: the caller runs it (`gather`, then handle)."""
        now = self.clock()
        burst = self._open.get(key)
        if burst is not None and self._takes(burst, now):
            burst.members.append(member)
            burst.last_at = now
            return None
        burst = Burst([member], now, now)
        if self.window > 0:
            self._open[key] = burst
        return burst

    def _takes(self, burst: Burst[T], now: float) -> bool:
        return (
            not burst.closed
            and now - burst.last_at <= self.window
            and now - burst.first_at < self.window * self.cap_factor
            and len(burst.members) < self.max_members
        )

    async def gather(self, burst: Burst[T]) -> list[T]:
        """Wait until `burst` closes (no new message for a window, or the
        cap), then close it; its members in arrival order."""
        while not burst.closed:
            closes_at = min(burst.last_at + self.window, burst.first_at + self.window * self.cap_factor)
            wait = closes_at - self.clock()
            if wait <= 0 or len(burst.members) >= self.max_members:
                burst.closed = True
            else:
                await asyncio.sleep(wait)  # a timer: a new member moves `last_at`, so look again
        for key, open_burst in list(self._open.items()):
            if open_burst is burst:
                del self._open[key]
        return list(burst.members)


def merge(built: Sequence[Sequence[Event | Reply]]) -> UserMessage | None:
    """One event for a burst whose members each built exactly one plain,
    durable message of the same person and place: the first, with the
    others as its followers. None when they cannot be one event (then each
    member is handled on its own)."""
    events = [items[0] for items in built if len(items) == 1]
    if len(built) < 2 or len(events) != len(built):
        return None
    messages = [event for event in events if isinstance(event, UserMessage) and event.in_inbox]
    if len(messages) != len(events):
        return None
    leader, *followers = messages
    if any(f.agent_key != leader.agent_key or f.place.key != leader.place.key for f in followers):
        return None
    leader.followers = followers
    return leader


async def split_batch(store: MessageStore, agent_id: str, event: Event) -> list[Event]:
    """Take off batch `event` the followers whose message is recorded when its
    leader's is not, or not when its leader's is (see above); they are
    returned, in order, to be handled alone after it."""
    if not isinstance(event, UserMessage) or not event.followers:
        return []
    leader_recorded = await store.event_message_seq(agent_id, event.event_id) is not None
    keep: list[UserMessage] = []
    alone: list[Event] = []
    for follower in event.followers:
        recorded = await store.event_message_seq(agent_id, follower.event_id) is not None
        (keep if recorded == leader_recorded else alone).append(follower)
    event.followers = keep
    return alone
