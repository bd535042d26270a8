"""The check-in schedule store on SQLite, in the SQLiteStore's own file.

    schedules      one row per check-in or reminder (memory/schedules.py: Schedule)
    checkin_prefs  one row per user with settings (CheckinPrefs)

Times are INTEGER unix seconds (whole seconds, see memory/schedules.py), so
`claim` compares next_fire_at exactly.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from memory.schedules import CheckinPrefs, Schedule, ScheduleStore, new_schedule_id, whole_seconds
from memory.sqlite.base import SQLiteBase
from memory.types import utc_now

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

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

    def __init__(self, store: SQLiteBase) -> None:
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
