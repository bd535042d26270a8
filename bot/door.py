"""One door per agent: every kind of work on an agent comes in here.

Platform events (adapters/pipeline.py), check-in ticks and reminders
(bot/checkins/scheduler.py), slash commands and the CLI's admin work all reach
an agent through its door, and an event meets the same gates whoever sent it,
in this order (outermost first; `Door.handle` is the whole chain):

1. turn        the agent's one lane in this process: one piece of work at a
               time, in arrival order (bot/durable/lanes.py). The pipeline
               holds it from building an event to its last reply; a tick, a
               command or an admin call takes it for its own work.
2. store wait  a store fault redoes everything below with backoff, up to
               MEMGPT_STORE_WAIT (`StoreWait`, below).
3. lease       one process per agent across processes (bot/durable/leases.py);
               a turn that did not follow this process's own last one reloads
               the agent.
4. quarantine  after a crash a suspect event runs alone (bot/durable/inbox.py: Quarantine).
5. inbox       the event's row becomes running; a replayed follower its batch
               answered stops here (bot/durable/inbox.py, debounce.py).
6. limits      over a rate or a budget: kept, no LLM call (bot/limits.py).
7. agent       the agent's steps (bot/agent.py), metered.

`Doors` is the registry: it makes a door when work arrives for an agent and
forgets it when idle, keeps the loaded agents, writes the inbox (the only
writer: the pipeline records and finishes events through it), counts the work
in flight so that one shutdown (`Doors.settle`) drains every kind of it before
the store closes, and meters events for /metrics.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

from bot import metrics
from bot.agent import ANSWERED_KINDS, Agent, EventResult
from bot.durable.debounce import split_batch
from bot.durable.inbox import Inbox
from bot.durable.lanes import Lanes, Report, Send, StartGate, Turn
from bot.durable.leases import LeaseLostError, Leases
from bot.durable.outbox import Outbox
from bot.durable.redelivery import Sender
from bot.events import Event, FileUploaded, Reply, UserMessage
from bot.limits import UsageLimits
from bot.reports import plural
from bot.sanitize import sanitize_event
from bot.services import AgentServices
from memory.ingest.loader import load_document
from memory.store import StoreError
from memory.types import Block

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds shutdown waits for the work in flight: below Docker's 10 s stop timeout,
# after which the process is killed anyway (the inbox then redoes what was cut short).
SHUTDOWN_GRACE = 8.0


class Door:
    """The way in to one agent (see the module's docstring for the gates)."""

    def __init__(self, key: str, doors: Doors) -> None:
        self.key = key
        self._doors = doors

    def turn(self, *, after: StartGate | None = None) -> AbstractAsyncContextManager[Turn]:
        """Gate 1, the agent's lane, for the `async with` body. `after`: the start-up
        gate this holder waits at first (new events wait behind the last run's replays)."""
        return self._doors.turn(self.key, after=after)

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[Turn]:
        """The turn and the lease: for work that changes the agent (forget, share, import)."""
        async with self.turn() as turn, self._doors.leases.hold(self.key):
            yield turn

    async def handle(self, event: Event, turn: Turn | None = None) -> EventResult:
        """Run `event` through every gate; `turn`: the caller holds the lane already."""
        if turn is None:
            async with self.turn() as held:
                return await self.handle(event, held)
        for member in event.members():  # debounced followers too (bot/durable/debounce.py)
            sanitize_event(member)  # before anything stores or renders it (bot/sanitize.py)
        doors = self._doors
        detached: list[Event] = []  # followers the batch could not take (bot/durable/debounce.py)
        result = await doors.store_wait.run(event, functools.partial(self._attempt, event, detached))
        for alone in detached:  # each handled alone, after it
            result.replies += (await doors.store_wait.run(alone, functools.partial(self._attempt, alone, []))).replies
        if doors.on_active is not None and not result.unfinished and isinstance(event, UserMessage | FileUploaded):
            # The person answered: check-in back-off starts over.
            try:
                await doors.on_active(self.key, event.created_at)
            except StoreError as error:
                # The replies must still go out (they are in the outbox, unsent); the back-off catches up later.
                log.warning("could not note %s as active for check-ins (%s)", self.key, error)
        return result

    async def _attempt(self, event: Event, detached: list[Event]) -> EventResult:
        """One try of gates 3 to 7 (the store wait redoes it whole); the followers split
        off a batch go into `detached`."""
        doors, inbox = self._doors, self._doors.inbox
        # The lease's line (then the quarantine) is joined before any await, so events
        # keep their arrival order; if another process worked on the agent since our
        # last turn, the cached copy is stale and the agent is reloaded.
        async with doors.leases.hold(self.key) as lease, inbox.quarantine.admit(event.inbox_id):
            try:
                agent = await doors.agent(self.key, reload=not lease.continuous)
                detached[:] = await split_batch(doors.services.store, agent.id, event)
                # From here on, a crash may count against the event. The inbox write needs
                # no answer before the reads below: it shares their round trip to the store.
                running = asyncio.ensure_future(inbox.started(event))
                try:
                    answered = await inbox.answered_with_its_batch(agent.id, event)
                    held = None if answered else await doors.limits.admit(agent, event)
                finally:
                    await running
                if answered:
                    return EventResult()
                notice: list[Reply] = []
                if isinstance(event, FileUploaded) and held is None:
                    event.passages_saved = await doors.save_upload(agent, event)
                    notice = await doors.upload_notices(event)
                result = held if held is not None else await doors.limits.metered(agent, event)
                result.replies = notice + result.replies
                await inbox.ran(event)
            except StoreError:
                # A failed write can leave the cached agent ahead of the store
                # (its queue, counts, blocks): a redo starts from what was stored.
                doors.drop_agent(self.key)
                raise
        return result


class Doors:
    """The registry of doors, and what every door shares (see the module's docstring)."""

    def __init__(
        self,
        services: AgentServices,
        blocks: Callable[[], list[Block]],
        *,
        leases: Leases,
        inbox: Inbox,
        outbox: Outbox,
        store_wait: StoreWait,
        limits: UsageLimits,
    ) -> None:
        self.services = services
        self._blocks = blocks  # a new agent's working context
        self.leases = leases
        self.inbox = inbox
        self.outbox = outbox
        self.store_wait = store_wait
        self.limits = limits
        # Told when a person wrote, with when (check-in back-off starts over); set by `memgpt-bot run`.
        self.on_active: Callable[[str, datetime], Awaitable[None]] | None = None
        self.lanes = Lanes()  # gate 1 for every agent, and each person's delivery order
        self._agents: dict[str, Agent] = {}
        # Work in flight, for `settle`: turns held or awaited (an event's, from building it to
        # its last reply; a tick's; a command's), and inbox writes under way.
        self._open: dict[object, asyncio.Event] = {}
        self._after: set[asyncio.Task[None]] = set()  # what `after` started, held while it runs

    def door(self, key: str) -> Door:
        return Door(key, self)

    # -- gate 1, and the count of work in flight ----------------------------------
    @asynccontextmanager
    async def turn(self, key: str, *, after: StartGate | None = None) -> AsyncIterator[Turn]:
        with self.counted():
            async with self.lanes.hold(key, after=after):
                yield Turn(key)

    def counted(self) -> _Open:
        """Counts the `with` body as work in flight, for `settle`."""
        return _Open(self._open)

    def after(self, work: Callable[[], Awaitable[object]]) -> None:
        """Run `work` beside the caller's turn, counted in flight from now: for what must
        not wait inside the door asking for it (it passes other people's doors)."""
        counted = self.counted()
        counted.__enter__()

        async def running() -> None:
            try:
                await work()
            except Exception:
                log.exception("work started by an agent's turn failed")
            finally:
                counted.__exit__()

        task = asyncio.create_task(running())
        self._after.add(task)
        task.add_done_callback(self._after.discard)

    async def settle(self, within: float = SHUTDOWN_GRACE, *, say: Callable[[str], Any] | None = None) -> int:
        """The one shutdown wait: at most `within` seconds for the work in flight now
        (events, ticks, commands, admin calls; not what arrives meanwhile); how many
        were still running when the wait ended."""
        waiting = [done for done in self._open.values() if not done.is_set()]
        if not waiting:
            return 0
        if say is not None:
            say(f"stopping: waiting up to {within:.0f} s for {len(waiting)} events and calls in flight")
        _, pending = await asyncio.wait([asyncio.create_task(done.wait()) for done in waiting], timeout=within)
        for task in pending:
            task.cancel()
        if pending:
            log.warning(
                "%d still in flight after %.0f s; the inbox redoes them at the next start", len(pending), within
            )
        return len(pending)

    # -- the agents ------------------------------------------------------------
    async def agent(self, key: str, *, reload: bool = False) -> Agent:
        """The loaded agent (the caller holds its turn)."""
        if reload:
            self._agents.pop(key, None)
        agent = self._agents.get(key)
        if agent is None:
            agent = self._agents[key] = await Agent.load(key, self._blocks(), self.services)
        return agent

    def drop_agent(self, key: str) -> None:
        """Its next turn reads it from the store again (after a change made around it)."""
        self._agents.pop(key, None)

    @property
    def agents_in_memory(self) -> int:
        return len(self._agents)

    # -- the event port (bot/ports.py): the inbox's one writer -----------------------
    async def handle(self, event: Event, turn: Turn | None = None) -> list[Reply]:
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await self.door(event.agent_key).handle(event, turn)
            outcome = "replied" if result.replies else "silent"
            return result.replies
        finally:
            metrics.record_event(event.platform, time.perf_counter() - started, outcome)

    async def receive(self, platform: str, event_id: str, user_id: str, payload: dict[str, Any]) -> bool:
        # Its work is counted in flight by the turn its task takes first (adapters/pipeline.py).
        with self.counted():
            fresh = await self.inbox.receive(platform, event_id, user_id, payload)
        if fresh:
            metrics.EVENTS_RECEIVED.labels(platform).inc()
        return fresh

    async def finished(self, event_id: str) -> None:
        with self.counted():
            await self.inbox.finished(event_id)

    async def deliver(self, replies: Sequence[Reply], send: Send, report: Report | None = None) -> None:
        """Send replies in each person's order (Lanes.deliver), reporting each to the outbox."""
        await self.lanes.deliver(replies, send, report or self.outbox.report)

    async def admin(self, key: str, work: Callable[[], Awaitable[T]], *, changes: bool = True) -> T:
        """Run `work` in the agent's turn (and, when it `changes` the agent, under its lease);
        a change drops the loaded agent, so its next turn reads what the work left."""
        door = self.door(key)
        async with door.exclusive() if changes else door.turn():
            try:
                return await work()
            finally:
                if changes:
                    self.drop_agent(key)

    # -- uploads (gate 7 for a FileUploaded) ---------------------------------------
    async def save_upload(self, agent: Agent, event: FileUploaded) -> int:
        # The same extraction, chunking and de-duplication as `memgpt-bot load`;
        # vectors are written with the passages, so the agent can search them at once.
        result = await load_document(
            self.services.archival,
            agent.id,
            event.filename,
            event.data,
            event.content_type,
            text=event.text or None,
            counter=self.services.counter,
            place=event.place.key,  # an upload in a DM stays DM-only (memory/places.py)
        )
        if result.status == "failed":
            event.load_error = result.reason
            return 0
        agent.counted(event.place.key, passages=result.passages_added)
        return result.passages

    async def upload_notices(self, event: FileUploaded) -> list[Reply]:
        """The "Saved X" notice; for an event whose replies go through the outbox, through
        it too (under its own id, so it never counts as the agent's answer, and is not sent
        again when the event is redone)."""
        if event.load_error:
            text = f"I couldn't read {event.filename}: {event.load_error}"
        else:
            text = f"Saved {event.filename} to my memory ({plural(event.passages_saved, 'passage')})."
        reply = event.reply(text)
        return await self.outbox.file_notice(reply) if event.replies_in_outbox else [reply]


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
    """Store faults: events wait out a busy, full or unreachable database.

    An event that meets a StoreError (SQLite busy or locked past its busy
    timeout, a full disk, MongoDB unreachable, a lease lost with it) is redone
    whole after a pause that doubles from 0.5 s up to 8 s, until
    MEMGPT_STORE_WAIT seconds after it arrived. Redoing is safe (bot/durable/__init__.py):
    a durable event's message is recorded once (Message.event_id) and its replies
    once (the outbox); the runtime drops its cached agent before each redo,
    since a failed write can leave that copy ahead of the store.

    - Order: it runs inside the agent's turn (gate 1), held across attempts,
      so their later events wait behind this one. The lease is let go between
      attempts (another process may go ahead meanwhile).
    - The person: after the first failed attempt at a message or upload they get
      one notice (TROUBLE_NOTICE) through `notify`, which `memgpt-bot run` wires
      to the adapters' deliver (cli/app.py). Replies only leave at the end of an
      event, so the notice cannot travel with them. One per user until storage
      answers again, however many of their events wait.
    - Giving up: the result is `unfinished`, and its trouble text says what
      happens next. A durable event's inbox row says it waits, with its next
      try (Inbox.wait_for_storage: the adapter's `finished` leaves it so), and it
      is replayed in this run once due or once storage answers (Redelivery), or
      at the next start. The person is told
      so once per outage. A non-durable event was never kept, so its sender is
      asked to send it again, every time."""

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
            "it stays pending in the inbox for a replay" if kept else "it was not kept",
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


class _Open:
    """One piece of work counted in flight while its `with` body runs."""

    def __init__(self, registry: dict[object, asyncio.Event]) -> None:
        self._registry = registry
        self._token = object()
        self._done = asyncio.Event()

    def __enter__(self) -> None:
        self._registry[self._token] = self._done

    def __exit__(self, *_: object) -> None:
        del self._registry[self._token]
        self._done.set()
