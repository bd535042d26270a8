"""The one path every platform's events take, and the small contract a platform implements.

A platform (adapters/slack/, adapters/discord/, adapters/fake.py) only reads
its payloads and sends its replies: it turns what it receives into an
`Arrival` (who, where, the JSON the inbox keeps), builds typed events from it
(`Platform.build`) and sends one reply (`Platform.send`). Everything between
is here, once, in the order an event meets it:

1. take: an arrival joins the person's open burst in its conversation, if it
   may (bot/durable/debounce.py), or starts its own work, whose first step
   takes the agent's turn at its door (`EventPort.turn`, bot/door.py): arrival
   order holds;
2. record: the bot's inbox keeps it before the platform is answered
   (`EventPort.receive`); a repeat is dropped. When it cannot be recorded, a
   platform that delivers unacknowledged events again (Slack) is not
   answered, so it sends the event again; one that never does (Discord) has
   it handled all the same, without crash recovery;
3. in the turn: the burst's window closes, each member is built, and a burst
   of plain messages becomes one event (`merge`);
4. run: each event goes through the agent's door (`EventPort.handle`: the
   bot's gates, bot/door.py) while the platform shows it is working, and its
   replies are delivered in the person's order, each reported to the outbox
   (`EventPort.deliver`); a failure earns the person one apology (`APOLOGY`);
5. finish: the inbox marks the event done (`EventPort.finished`), in the
   same round trip to the store as the report of its last reply;
6. recover / replay: at start, what the last run left unfinished is redone
   in arrival order ahead of new events (`hold_new_events`, `recover`: the
   start gate); the storage wait's leftovers are redone the same way (`replay`);
7. drain / close: work in flight gets a grace period; an event arriving
   meanwhile is refused (a platform that delivers it again) or kept in the
   inbox for the next start (one that never does).

Connecting and closing are the adapter's own (`start`, `wait_ready`, `close`:
cli/app.py's Adapter); `OnPipeline` gives it the rest of what `memgpt-bot
run` calls (`hold_new_events`, `recover`, `replay`, `deliver`).

Bot-side rules (the gates: the store wait, leases, quarantine, follower
linking, limits) are the agent's door's (bot/door.py); this module only calls
the event port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from bot.durable.debounce import Burst, Debouncer, merge
from bot.durable.lanes import Report, StartGate, Turn
from bot.events import Delivery, Event, Redo, Reply, agent_key
from bot.ports import EventPort

log = logging.getLogger(__name__)

Item = Event | Reply  # an event for the bot, or a notice the platform sends itself

APOLOGY = "Sorry, something went wrong on my side and I couldn't answer that. Please try again."


class Unfinished(Exception):
    """Raised by `Platform.build` when an event cannot be built now for a passing reason
    (the platform is unreachable): it stays unfinished in the inbox, redone at the next start."""


class PipelineClosing(Exception):
    """An event arrived while the pipeline closes: not acknowledged, so the platform delivers it again."""


@dataclass(eq=False)
class Arrival:
    """One platform event on its way through the pipeline."""

    event_id: str  # the inbox's key: a repeat delivery carries the same one
    user_id: str  # the platform's id of the person (their lane: agent_key(platform, user_id))
    conversation: str  # where it was said: quick messages in one conversation form one burst
    payload: dict[str, Any]  # what the inbox keeps to build the event again after a crash (plain JSON)
    mergeable: bool = False  # a plain message, which may join the person's burst
    awaits_answer: bool = True  # someone wrote and waits: told when it fails
    live: Any = None  # the platform's own object, in the process that received it
    in_inbox: bool = True  # recorded in the inbox (False: handled without crash recovery)
    repeat: bool = False  # the inbox had it already
    refused: bool = False  # could not be recorded, and the platform will deliver it again
    notice: str = ""  # given up by the inbox: this is said instead of a redo
    recorded: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once its replies were sent (or it ended without any), before the inbox's
    # "done" is written: the terminal reads its next line then (adapters/terminal.py).
    answered: asyncio.Event = field(default_factory=asyncio.Event)


class Platform(Protocol):
    """What a platform implements; the rest of the path is the `Pipeline`'s."""

    name: str  # the `platform` of its events and replies
    # Whether it delivers an event again until it is acknowledged (Slack), so an event
    # that could not be recorded is better refused than handled without the inbox.
    redelivers: bool

    def arrival_of(self, payload: Mapping[str, Any]) -> Arrival:
        """A recorded payload as an arrival again (a replay: no live object)."""
        ...

    async def build(self, arrival: Arrival) -> list[Item]:
        """The arrival's typed events (and notices), reading what they need; a replay
        may fetch the platform's object again. Raises Unfinished to keep it for later."""
        ...

    async def send(self, reply: Reply, answering: Arrival | None) -> tuple[Delivery, str]:
        """Send one reply (to `answering`'s conversation, else where `reply.reply_to` says); what came of it."""
        ...

    def notice(self, arrival: Arrival, text: str) -> Reply:
        """A message from the bot itself about the arrival (an apology, a given-up notice)."""
        ...

    def working(self, arrival: Arrival) -> AbstractAsyncContextManager[None]:
        """Shown while the bot works on the arrival (a typing indicator), or nothing."""
        ...


class OnPipeline:
    """What `memgpt-bot run` asks of an adapter that the pipeline answers (cli/app.py's Adapter)."""

    pipeline: Pipeline

    def hold_new_events(self) -> None:
        self.pipeline.hold_new_events()

    async def recover(self) -> int:
        return await self.pipeline.recover()

    async def replay(self, redos: Sequence[Redo]) -> int:
        return await self.pipeline.replay(redos)

    async def deliver(self, replies: Sequence[Reply]) -> None:
        """Send replies that answer no platform event (check-ins, the outbox's retries) where
        each one's `reply_to` says, each person's in order, reporting each to the outbox."""
        await self.pipeline.deliver(replies)

    async def drain(self) -> None:
        """Wait until every event taken so far has been answered."""
        await self.pipeline.drain()


class _Finish:
    """Marks one arrival's event done in the inbox (`EventPort.finished`), once."""

    def __init__(self, bot: EventPort, arrival: Arrival) -> None:
        self.bot, self.arrival, self.done = bot, arrival, False

    async def __call__(self) -> None:
        if not self.done:
            self.done = True
            await self.bot.finished(self.arrival.event_id)

    def with_report_of(self, last: Reply, report: Report) -> Report:
        """`report`, the event finished beside the report of `last` (both writes in flight at once)."""

        async def reporting(reply: Reply, outcome: Delivery, detail: str = "") -> Delivery:
            if reply is not last:
                return await report(reply, outcome, detail)
            self.arrival.answered.set()
            delivered, _ = await asyncio.gather(report(reply, outcome, detail), self())
            return delivered

        return reporting


class Pipeline:
    """The durable path of one platform's events, from taking one to its last reply."""

    def __init__(self, bot: EventPort, platform: Platform, debounce_seconds: float = 0.0) -> None:
        self.bot = bot
        self.platform = platform
        # Closed by `hold_new_events`: at start, new events wait here until the
        # events the last run left unfinished have taken their places in their lanes.
        self.start_gate = StartGate()
        self.bursts: Debouncer[Arrival] = Debouncer(debounce_seconds)
        self._tasks: set[asyncio.Task[None]] = set()
        self.closing = False

    # -- taking an event -----------------------------------------------------
    async def take(self, arrival: Arrival) -> asyncio.Task[None] | None:
        """Queue the arrival's work and record it; returns once it is recorded (acknowledge
        then) with the task that answers it, or None (it joined a burst, or we close)."""
        if self.closing:
            if self.platform.redelivers:
                log.info("%s: closing; event %s left to be delivered again", self.platform.name, arrival.event_id)
                raise PipelineClosing("closing")
            # It will not come again: kept in the inbox, the next start answers it.
            log.info("%s: closing; event %s kept for the next start", self.platform.name, arrival.event_id)
            await self._record(arrival)
            return None
        # Joined before any await, so arrival order holds (the burst, then the lane).
        burst = self.bursts.join(self._burst_key(arrival), arrival) if arrival.mergeable else self._alone(arrival)
        task = self._start(burst) if burst is not None else None
        try:
            await self._record(arrival)
        finally:
            arrival.recorded.set()
        return task

    def _burst_key(self, arrival: Arrival) -> str:
        return f"{arrival.user_id} {arrival.conversation}"

    @staticmethod
    def _alone(arrival: Arrival) -> Burst[Arrival]:
        return Burst([arrival], 0.0, 0.0, closed=True)

    async def _record(self, arrival: Arrival) -> None:
        name = self.platform.name
        try:
            if not await self.bot.receive(name, arrival.event_id, arrival.user_id, arrival.payload):
                log.info("%s: event %s was already received; ignoring the repeat", name, arrival.event_id)
                arrival.repeat = True
        except Exception as error:
            if self.platform.redelivers:
                arrival.refused = True
                raise
            # The store is down and the event will not come again: answering beats staying silent.
            log.warning(
                "%s: could not record event %s (%s); handling it without crash recovery", name, arrival.event_id, error
            )
            arrival.in_inbox = False

    def _start(self, burst: Burst[Arrival], *, early: bool = False) -> asyncio.Task[None]:
        # Our own task (not the platform library's) so close() can wait for it.
        return self._track(self._process(burst, early), f"{self.platform.name}-event-{burst.members[0].event_id}")

    def _track(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of this pipeline's: `drain` and `close` wait for it."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- in the person's lane --------------------------------------------------
    async def _process(self, burst: Burst[Arrival], early: bool) -> None:
        # The first await: it fixes this event's (or burst's) place in line.
        try:
            await self._in_lane(burst, early)
        finally:
            for member in burst.members:  # a repeat, a follower, one left unfinished: nothing more comes
                member.answered.set()

    async def _in_lane(self, burst: Burst[Arrival], early: bool) -> None:
        key = agent_key(self.platform.name, burst.members[0].user_id)
        # The agent's turn (bot/door.py), held from building to the last reply.
        async with self.bot.turn(key, after=None if early else self.start_gate) as turn:
            members = await self.bursts.gather(burst)
            for member in members:
                await member.recorded.wait()
            kept = [member for member in members if not (member.repeat or member.refused)]
            built: list[tuple[Arrival, list[Item] | None]] = []
            for member in kept:
                try:
                    built.append((member, await self._build(member)))
                except Unfinished as error:
                    # Left unfinished: the next start tries it again (bot/durable/inbox.py caps the restarts).
                    log.warning("%s: event %s left for the next start: %s", self.platform.name, member.event_id, error)
            readable = [items for _, items in built if items is not None]
            batch = merge(readable) if len(readable) == len(built) else None
            if batch is not None:
                await self._run(built[0][0], [batch], turn)
                for member, _ in built[1:]:
                    await self.bot.finished(member.event_id)
            else:
                for member, items in built:
                    await self._run(member, items, turn)

    async def _build(self, arrival: Arrival) -> list[Item] | None:
        """The arrival's items; None (logged) when they cannot be built."""
        if arrival.notice:  # given up: the person is told (once, through the outbox), instead of a redo
            if not arrival.awaits_answer:
                return []
            return list(await self.bot.file_notice(self.platform.notice(arrival, arrival.notice)))
        try:
            return await self.platform.build(arrival)
        except Unfinished:
            raise
        except Exception:
            log.exception("%s: reading event %s failed", self.platform.name, arrival.event_id)
            return None

    async def _run(self, arrival: Arrival, items: list[Item] | None, turn: Turn) -> None:
        """Hand the items of one arrival to the bot, deliver the replies, finish it."""
        # Not reached when a crash stops the work: then it stays pending and is redone.
        finish = _Finish(self.bot, arrival) if arrival.in_inbox else None
        try:
            if items is None:
                raise RuntimeError("the event could not be read")
            for n, item in enumerate(items):
                last = finish if n == len(items) - 1 else None
                if isinstance(item, Reply):
                    await self.deliver([item], answering=arrival, finish=last)
                    continue
                async with self.platform.working(arrival):
                    replies = await self.bot.handle(item, turn)
                await self.deliver(replies, answering=arrival, finish=last)
        except Exception:
            log.exception("%s: handling event %s failed", self.platform.name, arrival.event_id)
            if arrival.awaits_answer:
                await self.deliver([self.platform.notice(arrival, APOLOGY)], answering=arrival)
        arrival.answered.set()
        if finish is not None:
            await finish()  # when no reply of it was reported (none, or none in the outbox)

    async def deliver(
        self, replies: Sequence[Reply], *, answering: Arrival | None = None, finish: _Finish | None = None
    ) -> None:
        """Send replies in order, each person's behind their replies that wait for a retry
        (EventPort.deliver), reporting each one with an outbox entry. Also the way in for
        proactive messages and the outbox's retries. With `finish`: the event is
        marked done together with the report of its last reply (one round trip to
        the store): once that reply is sent, every reply was sent or handed to the retrier."""
        report: Report = self.bot.report_delivery
        if finish is not None and replies:
            report = finish.with_report_of(replies[-1], report)
        await self.bot.deliver(replies, partial(self.platform.send, answering=answering), report)

    def send_later(self, replies: Sequence[Reply]) -> None:
        """Deliver replies that answer no event (the listening notice) from a task of the
        pipeline's, so the platform's acknowledgement does not wait for them."""
        self._track(self.deliver(replies), f"{self.platform.name}-say")

    # -- crash recovery ------------------------------------------------------------
    def hold_new_events(self) -> None:
        """New events wait until `recover` has put the last run's unfinished ones in line."""
        self.start_gate.close()

    async def recover(self) -> int:
        """Replay the events a crash left unfinished, in arrival order, and wait for them;
        the number replayed. Call once connected, before new work (cli/app.py does)."""
        try:
            redos = await self.bot.leftovers(self.platform.name)
        except BaseException:
            self.start_gate.open()
            raise
        return await self.replay(redos)

    async def replay(self, redos: Sequence[Redo]) -> int:
        """Handle recorded events again, in order (through the people's lanes), and wait for
        them (only for them: new events keep arriving meanwhile on a busy bot); how many."""
        replays: list[asyncio.Task[None]] = []
        for redo in redos:
            if self.closing:
                log.info("%s: closing; not replaying event %s", self.platform.name, redo.event_id)
                continue
            arrival = self.platform.arrival_of(redo.payload)
            arrival.notice = redo.notice
            arrival.recorded.set()
            replays.append(self._start(self._alone(arrival), early=True))  # replays are never debounced
        self.start_gate.open()  # after the replays' tasks: they join their lanes first
        if replays:
            await asyncio.wait(replays)
        return len(redos)

    # -- closing -------------------------------------------------------------------
    async def drain(self) -> None:
        """Wait until every event taken so far has been answered."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self, grace: float = 10.0) -> None:
        """Refuse new events, give the work in flight `grace` seconds to finish (the bot's one
        shutdown wait: `EventPort.settle`), then cancel what is left of this platform's."""
        self.closing = True
        await self.bot.settle(grace)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
