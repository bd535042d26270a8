"""Where proactive check-ins and reminders are kept: the source of truth for the
scheduler, shared by every bot process that uses the same database.

The records are plain data: platform and reply_to are opaque strings and dicts
here (memory knows nothing of platforms). All times are UTC; fire times are
whole seconds, so that the compare-and-set in `claim` compares exact values on
every backend (SQLite integers, MongoDB millisecond dates).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from memory.sqlite.store import SQLiteStore
from memory.store import Store
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


class ScheduleStore(ABC):
    """Backend-neutral: every method maps onto one SQL statement or a few
    MongoDB calls (memory/mongo/schedules.py: there an insert against a unique
    index, not an update, makes `claim` exactly-once)."""

    @abstractmethod
    async def add(self, schedule: Schedule) -> Schedule:
        """Store a new schedule; gives it an id if it has none. Returns it."""

    @abstractmethod
    async def update(self, schedule: Schedule) -> bool:
        """Write the user-editable fields (times, zone, quiet hours, note,
        reply_to, paused, next_fire_at). Never the firing state (unanswered,
        last_fired_at), which only `claim` and `mark_user_activity` change, so
        an edit cannot undo a tick another process just fired. False if gone."""

    @abstractmethod
    async def get(self, schedule_id: str) -> Schedule | None: ...

    @abstractmethod
    async def list_for_user(self, agent_key: str) -> list[Schedule]:
        """That user's schedules, oldest first."""

    @abstractmethod
    async def list_all(self) -> list[Schedule]:
        """Admin and resync: every schedule, oldest first."""

    @abstractmethod
    async def list_due(self, now: datetime) -> list[Schedule]:
        """Unpaused schedules with next_fire_at <= now, earliest first."""

    @abstractmethod
    async def delete(self, schedule_id: str) -> bool: ...

    @abstractmethod
    async def delete_for_agent_key(self, agent_key: str) -> int:
        """/forget: every schedule and the prefs of that user; how many schedules."""

    @abstractmethod
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

    @abstractmethod
    async def mark_user_activity(self, agent_key: str, at: datetime) -> list[Schedule]:
        """The user wrote at `at`: reset the unanswered count of their schedules
        that fired at or before `at`. Returns those schedules as they were
        before the reset (so the caller can undo a back-off)."""

    @abstractmethod
    async def get_prefs(self, agent_key: str) -> CheckinPrefs:
        """The user's prefs; empty ones (all None) if never set."""

    @abstractmethod
    async def save_prefs(self, prefs: CheckinPrefs) -> None: ...


def schedule_store_for(store: Store) -> ScheduleStore:
    """The schedule store living next to `store` (same database)."""
    if isinstance(store, SQLiteStore):
        return SQLiteScheduleStore(store)
    # Imported here: memory.mongo.schedules builds on this module (and pulls in PyMongo).
    from memory.mongo.base import MongoBase

    if isinstance(store, MongoBase):
        from memory.mongo.schedules import MongoScheduleStore

        return MongoScheduleStore(store)
    raise NotImplementedError(f"no schedule store for {type(store).__name__} yet")


# -- SQLite ------------------------------------------------------------------
_COLS = (
    "id, agent_key, platform, user_id, kind, timezone, time_of_day, weekday, every_hours, run_at,"
    " quiet_start, quiet_end, note, reply_to, paused, next_fire_at, unanswered, last_fired_at,"
    " created_at, claimed_by"
)
_SELECT = f"SELECT {_COLS} FROM schedules"
_ORDER = " ORDER BY created_at, rowid"


def _sec(moment: datetime | None) -> int | None:
    return None if moment is None else (whole_seconds(moment) - _EPOCH) // timedelta(seconds=1)


def _at(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _row(row: Sequence[Any]) -> Schedule:
    return Schedule(
        id=row[0],
        agent_key=row[1],
        platform=row[2],
        user_id=row[3],
        kind=row[4],
        timezone=row[5],
        time_of_day=row[6],
        weekday=row[7],
        every_hours=row[8],
        run_at=_at(row[9]),
        quiet_start=row[10],
        quiet_end=row[11],
        note=row[12],
        reply_to=json.loads(row[13]),
        paused=bool(row[14]),
        next_fire_at=_at(row[15]),
        unanswered=row[16],
        last_fired_at=_at(row[17]),
        created_at=_at(row[18]) or utc_now(),
        claimed_by=row[19],
    )


class SQLiteScheduleStore(ScheduleStore):
    """Runs on the SQLiteStore's own connection and worker thread, so schedule
    writes are serialized with memory writes in this process, and BEGIN
    IMMEDIATE orders them against other processes on the same file."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    async def _read(self, sql: str, *args: Any) -> list[Schedule]:
        def job(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(sql, args).fetchall()

        return [_row(row) for row in await self._store.run_in_db(job)]

    async def add(self, schedule: Schedule) -> Schedule:
        def job(conn: sqlite3.Connection) -> str:
            for _ in range(8):
                candidate = schedule.id or new_schedule_id()
                inserted = conn.execute(
                    f"INSERT INTO schedules ({_COLS}) VALUES ({', '.join('?' * 20)}) ON CONFLICT (id) DO NOTHING",
                    (
                        candidate,
                        schedule.agent_key,
                        schedule.platform,
                        schedule.user_id,
                        schedule.kind,
                        schedule.timezone,
                        schedule.time_of_day,
                        schedule.weekday,
                        schedule.every_hours,
                        _sec(schedule.run_at),
                        schedule.quiet_start,
                        schedule.quiet_end,
                        schedule.note,
                        json.dumps(schedule.reply_to),
                        int(schedule.paused),
                        _sec(schedule.next_fire_at),
                        schedule.unanswered,
                        _sec(schedule.last_fired_at),
                        _sec(schedule.created_at),
                        schedule.claimed_by,
                    ),
                ).rowcount
                if inserted:
                    return candidate
                if schedule.id:
                    raise ValueError(f"schedule id {schedule.id!r} is taken")
            raise RuntimeError("could not find a free schedule id")

        schedule.id = await self._store.run_in_db(job, write=True)
        return schedule

    async def update(self, schedule: Schedule) -> bool:
        def job(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "UPDATE schedules SET timezone = ?, time_of_day = ?, weekday = ?, every_hours = ?, run_at = ?,"
                " quiet_start = ?, quiet_end = ?, note = ?, reply_to = ?, paused = ?, next_fire_at = ?"
                " WHERE id = ?",
                (
                    schedule.timezone,
                    schedule.time_of_day,
                    schedule.weekday,
                    schedule.every_hours,
                    _sec(schedule.run_at),
                    schedule.quiet_start,
                    schedule.quiet_end,
                    schedule.note,
                    json.dumps(schedule.reply_to),
                    int(schedule.paused),
                    _sec(schedule.next_fire_at),
                    schedule.id,
                ),
            ).rowcount

        return bool(await self._store.run_in_db(job, write=True))

    async def get(self, schedule_id: str) -> Schedule | None:
        rows = await self._read(f"{_SELECT} WHERE id = ?", schedule_id)
        return rows[0] if rows else None

    async def list_for_user(self, agent_key: str) -> list[Schedule]:
        return await self._read(f"{_SELECT} WHERE agent_key = ?{_ORDER}", agent_key)

    async def list_all(self) -> list[Schedule]:
        return await self._read(_SELECT + _ORDER)

    async def list_due(self, now: datetime) -> list[Schedule]:
        sql = f"{_SELECT} WHERE paused = 0 AND next_fire_at <= ? ORDER BY next_fire_at, rowid"
        return await self._read(sql, _sec(now))

    async def delete(self, schedule_id: str) -> bool:
        def job(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM schedules WHERE id = ?", (schedule_id,)).rowcount

        return bool(await self._store.run_in_db(job, write=True))

    async def delete_for_agent_key(self, agent_key: str) -> int:
        def job(conn: sqlite3.Connection) -> int:
            conn.execute("DELETE FROM checkin_prefs WHERE agent_key = ?", (agent_key,))
            return conn.execute("DELETE FROM schedules WHERE agent_key = ?", (agent_key,)).rowcount

        return int(await self._store.run_in_db(job, write=True))

    async def claim(
        self,
        schedule_id: str,
        due_at: datetime,
        next_fire_at: datetime | None,
        owner: str,
        *,
        fired_at: datetime | None = None,
    ) -> bool:
        due = _sec(due_at)

        def job(conn: sqlite3.Connection) -> int:
            if next_fire_at is None:
                return conn.execute(
                    "DELETE FROM schedules WHERE id = ? AND next_fire_at = ? AND paused = 0", (schedule_id, due)
                ).rowcount
            return conn.execute(
                "UPDATE schedules SET next_fire_at = ?, claimed_by = ?,"
                " last_fired_at = coalesce(?, last_fired_at), unanswered = unanswered + ?"
                " WHERE id = ? AND next_fire_at = ? AND paused = 0",
                (_sec(next_fire_at), owner, _sec(fired_at), int(fired_at is not None), schedule_id, due),
            ).rowcount

        return bool(await self._store.run_in_db(job, write=True))

    async def mark_user_activity(self, agent_key: str, at: datetime) -> list[Schedule]:
        where = " WHERE agent_key = ? AND unanswered > 0 AND (last_fired_at IS NULL OR last_fired_at <= ?)"
        args = (agent_key, _sec(at))

        def job(conn: sqlite3.Connection) -> list[Any]:
            rows = conn.execute(_SELECT + where, args).fetchall()
            if rows:
                conn.execute("UPDATE schedules SET unanswered = 0" + where, args)
            return rows

        return [_row(row) for row in await self._store.run_in_db(job, write=True)]

    async def get_prefs(self, agent_key: str) -> CheckinPrefs:
        def job(conn: sqlite3.Connection) -> list[Any]:
            sql = "SELECT timezone, quiet_start, quiet_end FROM checkin_prefs WHERE agent_key = ?"
            return conn.execute(sql, (agent_key,)).fetchall()

        rows = await self._store.run_in_db(job)
        return CheckinPrefs(agent_key, *rows[0]) if rows else CheckinPrefs(agent_key)

    async def save_prefs(self, prefs: CheckinPrefs) -> None:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO checkin_prefs (agent_key, timezone, quiet_start, quiet_end, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (agent_key) DO UPDATE SET timezone = excluded.timezone,"
                " quiet_start = excluded.quiet_start, quiet_end = excluded.quiet_end,"
                " updated_at = excluded.updated_at",
                (prefs.agent_key, prefs.timezone, prefs.quiet_start, prefs.quiet_end, _sec(utc_now())),
            )

        await self._store.run_in_db(job, write=True)
