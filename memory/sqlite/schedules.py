"""The check-in schedule store on SQLite, in the SQLiteStore's own file.

    schedules      one row per check-in or reminder (memory/schedules.py: Schedule)
    checkin_prefs  one row per user with settings (CheckinPrefs)

Times are INTEGER unix seconds (whole seconds, see memory/schedules.py), so
`claim` compares next_fire_at exactly.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from memory.schedules import (
    EDITABLE_FIELDS,
    STORED_FIELDS,
    CheckinPrefs,
    Schedule,
    ScheduleStore,
    new_schedule_id,
    stored_fields,
    stored_schedule,
    whole_seconds,
)
from memory.sqlite.base import SQLiteBase
from memory.types import utc_now

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_COLS = ", ".join(("id", *STORED_FIELDS))
_INSERT = (
    f"INSERT INTO schedules ({_COLS}) VALUES ({', '.join('?' * (1 + len(STORED_FIELDS)))}) ON CONFLICT (id) DO NOTHING"
)
_SELECT = f"SELECT {_COLS} FROM schedules"
_EDITABLE_SET = ", ".join(f"{name} = ?" for name in EDITABLE_FIELDS)
_ORDER = " ORDER BY created_at, rowid"


def _sec(moment: datetime | None) -> int | None:
    return None if moment is None else (whole_seconds(moment) - _EPOCH) // timedelta(seconds=1)


def _at(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _row(row: Sequence[Any]) -> Schedule:
    return stored_schedule(row[0], dict(zip(STORED_FIELDS, row[1:], strict=True)), _at)


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
                values = (candidate, *stored_fields(schedule, STORED_FIELDS, _sec).values())
                inserted = conn.execute(_INSERT, values).rowcount
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
                f"UPDATE schedules SET {_EDITABLE_SET} WHERE id = ?",
                (*stored_fields(schedule, EDITABLE_FIELDS, _sec).values(), schedule.id),
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
