"""One first-in, first-out lane per user, and one delivery order.

`Lanes.hold(key)` lets one holder in at a time per key, in the order they
arrived: nothing awaits before the lane's queue is joined, and asyncio.Lock
wakes its waiters in order. A lane is dropped as soon as nobody holds or waits
for it (and no reply of that user waits for a retry), so a bot that met a
million people keeps no million locks. The agents' doors (bot/door.py) hold
one instance: each agent's one lane, in which an event is built, handled and
answered; the leases use their own for their ticket draws and local turns
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
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from bot.events import Delivery, Reply

# Sends one reply: how it went and why (for the log and the outbox).
Send = Callable[[Reply], Awaitable[tuple[Delivery, str]]]
# Records how it went (the bot's report_delivery); returns what the outbox made
# of it (a reply failed too often is dropped: UNDELIVERABLE).
Report = Callable[[Reply, Delivery, str], Awaitable[Delivery]]
# Longer than the outbox retries a reply (12 sends, backoff up to 10 min: about 1.5 h).
HOLD_AT_MOST = 3 * 3_600.0


@dataclass(frozen=True, slots=True)
class Turn:
    """Proof that the holder is in its agent's lane (bot/door.py: so its handling does not queue again)."""

    key: str


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
    async def hold(self, key: str, *, after: StartGate | None = None) -> AsyncIterator[None]:
        """Wait for `key`'s turn and hold it for the `async with` body. `after`: a
        start-up gate to pass first (an event the last run left unfinished passes none)."""
        waited = after is not None and await after.wait()
        lane = self._lane(key)
        lane.users += 1
        if waited and after is not None:
            after.joined()  # in its lane (or its lock's queue) before any await
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
            key = reply.agent_key
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


class StartGate:
    """A platform's start-up gate (adapters/pipeline.py): closed until the events
    the last run left unfinished have taken their places in their lanes, so a new
    message cannot overtake the replay of the same person's older one. While
    closed, and until everyone who waited at it has joined a lane, holders wait
    here in arrival order.

    Why not an asyncio.Event: the place in line is taken in a task's first
    step, and a task created before `open` may run that step after it. Seen
    in the crash harness ("U3's message 5 answered 0 times, 11 answered 2
    times"): a new message's receive and the start-up inbox read finished
    in the same turn of the loop, so its task existed, not yet run, when
    recover() created the replays' tasks and released; run first (it was
    created first), it found the gate open and took its lane ahead of the
    replay of the person's older message, which was then redone after the
    newer one was recorded and answered it instead. So the gate opens on
    the loop's next turn, behind every first step already scheduled (each
    task created so far has then taken its place: the early ones in their
    lanes, the others here), and a holder that comes while those let
    through have not all joined their lanes yet waits behind them."""

    def __init__(self) -> None:
        self._closed = False
        self._queue: deque[asyncio.Future[None]] = deque()
        self._passing = 0  # let through, not yet in their lanes

    def close(self) -> None:
        self._closed = True

    def open(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: no task can be waiting or about to
            self._closed = False
            return
        loop.call_soon(self._opened)

    def _opened(self) -> None:
        self._closed = False
        if not self._passing:
            self._let_through()

    def _let_through(self) -> None:
        turns = [turn for turn in self._queue if not turn.done()]
        self._queue.clear()
        self._passing += len(turns)
        for turn in turns:
            turn.set_result(None)

    async def wait(self) -> bool:
        """Until this holder's turn to join its lane; whether it waited (then
        it calls `joined` once in its lane)."""
        if not (self._closed or self._queue or self._passing):
            return False
        turn = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # let through, then cancelled before it ran
                self.joined()
            raise
        return True

    def joined(self) -> None:
        self._passing -= 1
        if not self._passing and not self._closed and self._queue:
            self._let_through()  # those who came meanwhile, in their order
