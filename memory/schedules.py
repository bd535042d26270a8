"""Where proactive check-ins and reminders are kept: the source of truth for the
scheduler, shared by every bot process that uses the same database.

This module holds the records, the form a backend stores one in (stored_fields,
stored_schedule) and the ScheduleStore role; each backend
keeps its implementation beside its store (memory/sqlite/schedules.py,
memory/mongo/schedules.py). The records are plain data: platform and reply_to are opaque strings and dicts
here (memory knows nothing of platforms). All times are UTC; fire times are
whole seconds, so that the compare-and-set in `claim` compares exact values on
every backend (SQLite integers, MongoDB millisecond dates).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable

from memory.types import utc_now

ScheduleKind = Literal["daily", "weekly", "interval", "once"]
SCHEDULE_KINDS: tuple[ScheduleKind, ...] = ("daily", "weekly", "interval", "once")


@dataclass(slots=True)
class Schedule:
    """One check-in (daily, weekly, every N hours) or one-time reminder of one user."""

    id: str
    agent_key: str
    platform: str
    user_id: str
    kind: ScheduleKind
    timezone: str = "UTC"  # IANA name; daily/weekly times and quiet hours are in it
    time_of_day: str | None = None  # "HH:MM", daily and weekly
    weekday: int | None = None  # 0 = Monday, weekly
    every_hours: int | None = None  # interval
    run_at: datetime | None = None  # once
    quiet_start: str | None = None  # "HH:MM"; both or neither
    quiet_end: str | None = None
    note: str = ""
    reply_to: dict[str, Any] = field(default_factory=dict)  # where the user set it up
    paused: bool = False
    next_fire_at: datetime | None = None
    unanswered: int = 0  # ticks fired since the user last wrote
    last_fired_at: datetime | None = None
    created_at: datetime = field(default_factory=utc_now)
    claimed_by: str | None = None  # the process that fired or advanced it last


@dataclass(slots=True)
class CheckinPrefs:
    """A user's check-in settings, kept even when they have no schedule yet."""

    agent_key: str
    timezone: str | None = None
    quiet_start: str | None = None
    quiet_end: str | None = None


# How backends store a schedule: every field but the id, by name.
STORED_FIELDS = tuple(field.name for field in fields(Schedule) if field.name != "id")
_IDENTITY = ("agent_key", "platform", "user_id", "kind", "created_at")
_FIRING_STATE = ("unanswered", "last_fired_at", "claimed_by")  # only `claim` and `mark_user_activity` change it
# What `ScheduleStore.update` writes: the user-editable fields.
EDITABLE_FIELDS = tuple(name for name in STORED_FIELDS if name not in _IDENTITY + _FIRING_STATE)
_TIMES = ("run_at", "next_fire_at", "last_fired_at", "created_at")


def stored_fields(schedule: Schedule, names: Sequence[str], store_time: Callable[[datetime], Any]) -> dict[str, Any]:
    """The named fields of `schedule` as a backend stores them: times through
    `store_time` (None stays None), reply_to as JSON text."""
    values = {name: getattr(schedule, name) for name in names}
    for name in _TIMES:
        if values.get(name) is not None:
            values[name] = store_time(values[name])
    if "reply_to" in values:
        values["reply_to"] = json.dumps(values["reply_to"])
    return values


def stored_schedule(
    schedule_id: str, stored: Mapping[str, Any], load_time: Callable[[Any], datetime | None]
) -> Schedule:
    """The schedule back from what `stored_fields` stored (times through `load_time`)."""
    values: dict[str, Any] = {name: stored.get(name) for name in STORED_FIELDS}
    for name in _TIMES:
        values[name] = load_time(values[name])
    values.update(
        note=values["note"] or "",
        reply_to=json.loads(values["reply_to"] or "{}"),
        paused=bool(values["paused"]),
        unanswered=int(values["unanswered"] or 0),
        created_at=values["created_at"] or utc_now(),
    )
    return Schedule(id=schedule_id, **values)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def whole_seconds(moment: datetime) -> datetime:
    """`moment` in UTC, cut down to the second with integer arithmetic (a float
    timestamp could round up across a second or minute boundary)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return _EPOCH + timedelta(seconds=(moment - _EPOCH) // timedelta(seconds=1))


def new_schedule_id() -> str:
    # Short, because people type it (`/checkin remove 3fa2c1`); a collision is
    # caught by the primary key and retried.
    return secrets.token_hex(3)


@runtime_checkable
class ScheduleStore(Protocol):
    """The schedules role. Backend-neutral: every method maps onto one SQL
    statement (memory/sqlite/schedules.py) or a few MongoDB calls
    (memory/mongo/schedules.py: there an insert against a unique index, not an
    update, makes `claim` exactly-once). A store that keeps schedules hands
    out its own as `store.schedules` (memory/roles.py: ScheduleHost)."""

    async def add(self, schedule: Schedule) -> Schedule:
        """Store a new schedule; gives it an id if it has none. Returns it."""

    async def update(self, schedule: Schedule) -> bool:
        """Write the user-editable fields (times, zone, quiet hours, note,
        reply_to, paused, next_fire_at). Never the firing state (unanswered,
        last_fired_at), which only `claim` and `mark_user_activity` change, so
        an edit cannot undo a tick another process just fired. False if gone."""

    async def get(self, schedule_id: str) -> Schedule | None: ...

    async def list_for_user(self, agent_key: str) -> list[Schedule]:
        """That user's schedules, oldest first."""

    async def list_all(self) -> list[Schedule]:
        """Admin and resync: every schedule, oldest first."""

    async def list_due(self, now: datetime) -> list[Schedule]:
        """Unpaused schedules with next_fire_at <= now, earliest first."""

    async def delete(self, schedule_id: str) -> bool: ...

    async def delete_for_agent_key(self, agent_key: str) -> int:
        """/forget: every schedule and the prefs of that user; how many schedules."""

    async def claim(
        self,
        schedule_id: str,
        due_at: datetime,
        next_fire_at: datetime | None,
        owner: str,
        *,
        fired_at: datetime | None = None,
    ) -> bool:
        """Atomic compare-and-set: only if the schedule is unpaused and its
        next_fire_at still equals `due_at`, move it to `next_fire_at` (None:
        delete it, a reminder that is done). With `fired_at` the tick counts as
        fired: last_fired_at = fired_at and unanswered + 1. Exactly one of
        several concurrent callers gets True."""

    async def mark_user_activity(self, agent_key: str, at: datetime) -> list[Schedule]:
        """The user wrote at `at`: reset the unanswered count of their schedules
        that fired at or before `at`. Returns those schedules as they were
        before the reset (so the caller can undo a back-off)."""

    async def get_prefs(self, agent_key: str) -> CheckinPrefs:
        """The user's prefs; empty ones (all None) if never set."""

    async def save_prefs(self, prefs: CheckinPrefs) -> None: ...
