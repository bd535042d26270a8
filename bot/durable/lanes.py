"""One first-in, first-out lane per user, and one delivery order.

`Lanes.hold(key)` lets one holder in at a time per key, in the order they
arrived: nothing awaits before the lane's queue is joined, and asyncio.Lock
wakes its waiters in order. A lane is dropped as soon as nobody holds or waits
for it (and no reply of that user waits for a retry), so a bot that met a
million people keeps no million locks. The adapters use it for their per-user
order (reading names and downloading files come before the bot sees an event,
sending after), the runtime and the storage wait for theirs, the leases for
their ticket draws and local turns: one implementation, several instances
(an instance held across a call must not be taken again inside it).

`Lanes.deliver` is the one delivery order, for both platforms: replies to one
person reach them in the order they were made. When one fails for a passing
reason (Delivery.RETRY: it stays in the outbox and is retried with backoff),
that person's later replies are not tried but reported RETRY too ("held
behind" it, in the outbox) until it is sent or dropped; the retrier then
sends them, oldest first. Other people's replies go on. A reply without an outbox entry (a notice) cannot wait
in the outbox: it is sent at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from bot.events import Delivery, Reply, agent_key

# Sends one reply: how it went and why (for the log and the outbox).
Send = Callable[[Reply], Awaitable[tuple[Delivery, str]]]
# Records how it went (the bot's report_delivery); returns what the outbox made
# of it (a reply failed too often is dropped: UNDELIVERABLE).
Report = Callable[[Reply, Delivery, str], Awaitable[Delivery]]
# Longer than the outbox retries a reply (12 sends, backoff up to 10 min: about 1.5 h).
HOLD_AT_MOST = 3 * 3_600.0


@dataclass(eq=False)
class _Lane:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # tasks holding or waiting for the lock
    # Outbox ids of replies waiting for a retry, oldest first -> since when (monotonic).
    waiting: dict[str, float] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return self.users == 0 and not self.waiting


class Lanes:
    def __init__(self) -> None:
        self._lanes: dict[str, _Lane] = {}

    def __len__(self) -> int:
        return len(self._lanes)

    def _lane(self, key: str) -> _Lane:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        return lane

    def _prune(self, key: str, lane: _Lane) -> None:
        if lane.idle and self._lanes.get(key) is lane:
            del self._lanes[key]

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Wait for `key`'s turn and hold it for the `async with` body."""
        lane = self._lane(key)
        lane.users += 1
        try:
            async with lane.lock:
                yield
        finally:
            lane.users -= 1
            self._prune(key, lane)

    async def deliver(self, replies: Sequence[Reply], send: Send, report: Report | None = None) -> None:
        """Send `replies` in order, each person's behind their replies that wait
        for a retry, and `report` each one with an outbox entry."""
        for reply in replies:
            key = agent_key(reply.platform, reply.user_id)
            lane = self._lane(key)
            ahead = self._ahead(lane)
            if reply.outbox_id and ahead is not None and ahead != reply.outbox_id:
                outcome, detail = Delivery.RETRY, f"held behind an earlier reply ({ahead}) that waits for a retry"
            else:
                outcome, detail = await send(reply)
            if reply.outbox_id and report is not None:
                outcome = await report(reply, outcome, detail)
            if reply.outbox_id:
                self._note(lane, reply.outbox_id, outcome)
            self._prune(key, lane)

    @staticmethod
    def _ahead(lane: _Lane) -> str | None:
        """The oldest reply waiting for a retry, if any. One that waited past
        every retry the outbox would make (or left the outbox another way,
        /forget) holds nobody back any longer."""
        now = time.monotonic()
        for outbox_id, since in list(lane.waiting.items()):
            if now - since <= HOLD_AT_MOST:
                return outbox_id
            del lane.waiting[outbox_id]
        return None

    @staticmethod
    def _note(lane: _Lane, outbox_id: str, outcome: Delivery) -> None:
        if outcome is Delivery.RETRY:
            lane.waiting.setdefault(outbox_id, time.monotonic())
        else:
            lane.waiting.pop(outbox_id, None)
