"""The check-in engine: turns due schedules into ScheduledTick events.

The schedules in the store are the source of truth. APScheduler is only this
process's alarm clock, fed from them: one DateTrigger job per schedule at its
next fire time, re-armed after each fire, plus a periodic resync that picks up
schedules other processes (or /checkin in another process) created or changed.
Every job just calls `run_due(clock())`, which does all the work and is what
the tests drive with a fake clock.

Exactly-once across processes comes from `ScheduleStore.claim`, a
compare-and-set on next_fire_at: whoever moves it first runs the tick. A tick
is claimed before it runs, so a crash mid-tick loses that tick rather than
sending it twice (at most once: a duplicate check-in is worse than a missing one).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.agent import EventResult
from bot.checkins.rules import (
    backoff_skips,
    format_local,
    humanize,
    next_fire,
    next_fire_with_backoff,
    tick_reason,
)
from bot.events import Event, Reply, ScheduledTick
from bot.settings import CheckinSettings
from memory.schedules import Schedule, ScheduleStore
from memory.store import Store
from memory.types import utc_now

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
Deliver = Callable[[list[Reply]], Awaitable[None] | None]

# Message kinds in recall storage that mean the person said or did something.
USER_KINDS = frozenset({"user_message", "file_uploaded", "imported"})
_JOB_PREFIX = "checkin:"
_RESYNC_JOB = "checkins:resync"


class TickRuntime(Protocol):
    """What the engine needs of bot.runtime.Runtime."""

    @property
    def store(self) -> Store: ...

    async def handle_with_details(self, event: Event) -> EventResult: ...


@dataclass(slots=True)
class TickOutcome:
    schedule_id: str
    agent_key: str
    due_at: datetime
    fired: bool  # False: skipped, it was missed by more than the grace period
    next_fire_at: datetime | None  # None: a reminder that is done (and deleted)
    replies: list[Reply] = field(default_factory=list)  # what was handed to deliver
    trouble: str | None = None


async def last_user_message_at(store: Store, key: str, *, window: int = 100, max_scan: int = 1_000) -> datetime | None:
    """When the person last wrote (from recall storage), looking back at most
    `max_scan` messages: None if they never did, or not within that."""
    record = await store.find_agent(key)
    if record is None:
        return None
    end = await store.count_messages(record.id)
    scanned = 0
    while end > 0 and scanned < max_scan:
        start = max(1, end - window + 1)
        batch = [m for m in await store.messages_since(record.id, start) if m.seq <= end]
        for message in reversed(batch):
            if message.role == "user" and message.name in USER_KINDS:
                return message.created_at
        scanned += end - start + 1
        end = start - 1
    return None


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


class CheckinScheduler:
    def __init__(
        self,
        runtime: TickRuntime,
        schedules: ScheduleStore,
        deliver: Deliver,
        clock: Clock = utc_now,
        settings: CheckinSettings | None = None,
        *,
        owner: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.schedules = schedules
        self.deliver = deliver
        self.clock = clock
        self.settings = settings or CheckinSettings()
        self.owner = owner or _owner()
        self._scheduler: AsyncIOScheduler | None = None
        self._armed: dict[str, datetime] = {}
        self._inflight: set[asyncio.Task[object]] = set()
        self._slots = asyncio.Semaphore(self.settings.concurrency)

    # -- the core: what a timer tick does --------------------------------
    async def run_due(self, now: datetime) -> list[TickOutcome]:
        """Claim and run every schedule due at `now`; ticks of different users
        run concurrently, ticks of one user queue behind their events."""
        due = await self.schedules.list_due(now)
        results = await asyncio.gather(*(self._run_one(schedule, now) for schedule in due), return_exceptions=True)
        outcomes: list[TickOutcome] = []
        for schedule, result in zip(due, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.error("check-in %s of %s failed: %s", schedule.id, schedule.agent_key, result, exc_info=result)
            elif result is not None:
                outcomes.append(result)
        return outcomes

    async def _run_one(self, schedule: Schedule, now: datetime) -> TickOutcome | None:
        due_at = schedule.next_fire_at
        if due_at is None:
            return None
        grace = timedelta(minutes=self.settings.grace_minutes)
        if now - due_at > grace:
            # Down (or stalled) past this tick. Fire once if some occurrence
            # falls inside the grace window, else skip to the future: never a
            # burst of stale ticks after a restart.
            recent = next_fire(schedule, now - grace - timedelta(microseconds=1))
            if recent is None or recent > now:
                return await self._skip(schedule, due_at, now)
        last_seen = await last_user_message_at(self.runtime.store, schedule.agent_key)
        answered = last_seen is not None and (schedule.last_fired_at is None or last_seen >= schedule.last_fired_at)
        if schedule.unanswered and answered:
            # They wrote since the last tick (perhaps to another process, or the
            # activity hook is not wired): the back-off starts over.
            await self.schedules.mark_user_activity(schedule.agent_key, last_seen or now)
            schedule.unanswered = 0
        following = next_fire_with_backoff(schedule, now, schedule.unanswered + 1, self.settings)
        if not await self.schedules.claim(schedule.id, due_at, following, self.owner, fired_at=now):
            return None  # another process or runtime got it
        tick = ScheduledTick(
            platform=schedule.platform,
            user_id=schedule.user_id,
            reply_to=dict(schedule.reply_to),
            created_at=now,
            reason=tick_reason(schedule),
            local_time=format_local(now, schedule.timezone),
            since_last_conversation=humanize(now - last_seen) if last_seen else "",
            outbox_only=True,  # a check-in written is delivered, even across a crash or a failed send
        )
        log.info("check-in %s of %s: tick due at %s", schedule.id, schedule.agent_key, due_at.isoformat())
        async with self._slots:
            # Queues behind any event of this agent in flight (the runtime's per-agent lock).
            result = await self.runtime.handle_with_details(tick)
        replies = result.replies
        if result.trouble:
            # The "I'm having trouble" note answers a person; nobody asked here.
            log.warning("check-in %s of %s: %s", schedule.id, schedule.agent_key, result.trouble)
            replies = [reply for reply in replies if reply.text != result.trouble]
        if replies:
            await self._deliver(replies)
        return TickOutcome(schedule.id, schedule.agent_key, due_at, True, following, replies, result.trouble)

    async def _skip(self, schedule: Schedule, due_at: datetime, now: datetime) -> TickOutcome | None:
        following = next_fire(schedule, now)
        if not await self.schedules.claim(schedule.id, due_at, following, self.owner):
            return None
        late = humanize(now - due_at)
        log.warning(
            "check-in %s of %s: skipped the tick due at %s (%s late, beyond the %d-minute grace period); %s",
            schedule.id,
            schedule.agent_key,
            due_at.isoformat(),
            late,
            self.settings.grace_minutes,
            f"next at {following.isoformat()}" if following else "reminder dropped",
        )
        return TickOutcome(schedule.id, schedule.agent_key, due_at, False, following)

    async def _deliver(self, replies: list[Reply]) -> None:
        try:
            sent = self.deliver(replies)
            if inspect.isawaitable(sent):
                await sent
        except Exception:
            # The tick stays in recall storage; a failed send is not retried
            # (the agent may have moved on by then).
            log.exception("delivering %d check-in replies failed", len(replies))

    # -- the person wrote ----------------------------------------------------
    async def user_active(self, agent_key: str, at: datetime | None = None) -> None:
        """Call when the person sends a message: resets the unanswered counts
        and brings a backed-off schedule back to its regular next time."""
        at = at or self.clock()
        now = self.clock()
        for schedule in await self.schedules.mark_user_activity(agent_key, at):
            current = schedule.next_fire_at
            if schedule.paused or current is None or not backoff_skips(schedule.unanswered, self.settings):
                continue
            regular = next_fire(schedule, now)
            if regular is not None and regular < current:
                if await self.schedules.claim(schedule.id, current, regular, self.owner):
                    self._arm(schedule.id, regular)

    # -- the in-process timer -----------------------------------------------
    async def start(self) -> None:
        """Arm a timer for every schedule and start the periodic resync. Ticks
        missed while down fire (or are skipped) at once, so start this when
        `deliver` can reach the platforms."""
        if self._scheduler is not None:
            return
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._scheduler.start()
        await self.resync()
        self._scheduler.add_job(
            self.resync,
            IntervalTrigger(seconds=self.settings.resync_seconds, timezone=UTC),
            id=_RESYNC_JOB,
            replace_existing=True,
            coalesce=True,
            max_instances=1,
        )

    async def stop(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.shutdown(wait=False)
        self._armed.clear()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def resync(self) -> None:
        """Make the armed timers match the store."""
        try:
            schedules = await self.schedules.list_all()
        except Exception as error:
            log.warning("check-ins: cannot read schedules: %s", error)
            return
        wanted = {s.id: s.next_fire_at for s in schedules if not s.paused and s.next_fire_at is not None}
        for schedule_id in list(self._armed):
            if schedule_id not in wanted:
                self._disarm(schedule_id)
        for schedule_id, when in wanted.items():
            if when is not None and self._armed.get(schedule_id) != when:
                self._arm(schedule_id, when)

    def armed(self) -> dict[str, datetime]:
        """Schedule id -> when its timer goes off (for tests and the admin)."""
        return dict(self._armed)

    def _arm(self, schedule_id: str, when: datetime) -> None:
        if self._scheduler is None:
            return
        # misfire_grace_time=None: a late timer still calls run_due, which
        # applies the check-in grace period itself.
        self._scheduler.add_job(
            self._fire,
            DateTrigger(run_date=when, timezone=UTC),
            args=[schedule_id],
            id=_JOB_PREFIX + schedule_id,
            replace_existing=True,
            misfire_grace_time=None,
            coalesce=True,
        )
        self._armed[schedule_id] = when

    def _disarm(self, schedule_id: str) -> None:
        self._armed.pop(schedule_id, None)
        if self._scheduler is not None and self._scheduler.get_job(_JOB_PREFIX + schedule_id):
            self._scheduler.remove_job(_JOB_PREFIX + schedule_id)

    async def _fire(self, schedule_id: str) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            self._armed.pop(schedule_id, None)  # a DateTrigger job runs once
            now = self.clock()
            outcomes = await self.run_due(now)
            for outcome in outcomes:
                if outcome.next_fire_at is not None:
                    self._arm(outcome.schedule_id, outcome.next_fire_at)
            if schedule_id not in {outcome.schedule_id for outcome in outcomes}:
                # Claimed elsewhere or changed meanwhile: follow the store. A time
                # still in the past is left to the next resync (no hot loop).
                schedule = await self.schedules.get(schedule_id)
                if schedule and not schedule.paused and schedule.next_fire_at and schedule.next_fire_at > now:
                    self._arm(schedule_id, schedule.next_fire_at)
        finally:
            if task is not None:
                self._inflight.discard(task)
