"""SQLiteStore's share of usage limits: the UsageStore role (memory/roles.py),
as a mixin of SQLiteStore.

One row per hit (a message let through, the tokens of one event's LLM calls,
a notice sent), counted or summed over a time window. The MongoDB twin
(memory/mongo/usage.py) has to work that way, because FerretDB loses
concurrent `$inc`s but never an insert; the same shape here keeps both
backends alike, and a hit never contends for a shared counter row. Rows older
than the longest window are swept by `prune_usage` (bot/limits.py calls it
now and then).

Times are integer microseconds since the epoch (UTC), as given by the caller,
so a stored instant comes back exactly.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from memory.sqlite.base import SQLiteBase
from memory.store import UsageTally

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_us(moment: datetime) -> int:
    # A naive datetime is taken as UTC, as everywhere in the store.
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def tally(count: int, amount: int, oldest: int | None, newest: int | None) -> UsageTally:
    return UsageTally(
        count=int(count),
        amount=int(amount),
        oldest=None if oldest is None else from_us(int(oldest)),
        newest=None if newest is None else from_us(int(newest)),
    )


class SQLiteUsage(SQLiteBase):
    async def record_usage(self, key: str, hits: Mapping[str, int], at: datetime) -> None:
        rows = [(key, kind, to_us(at), int(amount)) for kind, amount in hits.items()]

        def job(conn: sqlite3.Connection) -> None:
            conn.executemany("INSERT INTO usage_hits (key, kind, at, amount) VALUES (?, ?, ?, ?)", rows)

        await self.run_in_db(job, write=True)

    async def usage_since(self, key: str, kind: str, since: datetime) -> UsageTally:
        return await self.run_in_db(lambda conn: _usage_since(conn, key, kind, since))

    async def usage_check(self, key: str, windows: Sequence[tuple[str, datetime]]) -> tuple[bool, list[UsageTally]]:
        def job(conn: sqlite3.Connection) -> tuple[bool, list[UsageTally]]:
            exempt = conn.execute("SELECT 1 FROM usage_exempt WHERE key = ?", (key,)).fetchone() is not None
            return exempt, [_usage_since(conn, key, kind, since) for kind, since in windows]

        return await self.run_in_db(job)

    async def prune_usage(self, before: datetime) -> int:
        def job(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM usage_hits WHERE at < ?", (to_us(before),)).rowcount

        return await self.run_in_db(job, write=True)

    async def delete_usage(self, key: str) -> int:
        def job(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM usage_hits WHERE key = ?", (key,)).rowcount

        return await self.run_in_db(job, write=True)

    async def set_usage_exempt(self, key: str, exempt: bool, at: datetime) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            if exempt:
                sql = "INSERT INTO usage_exempt (key, since) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
                return bool(conn.execute(sql, (key, to_us(at))).rowcount)
            return bool(conn.execute("DELETE FROM usage_exempt WHERE key = ?", (key,)).rowcount)

        return await self.run_in_db(job, write=True)

    async def usage_exempt(self, key: str) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            return conn.execute("SELECT 1 FROM usage_exempt WHERE key = ?", (key,)).fetchone() is not None

        return await self.run_in_db(job)

    async def list_usage_exempt(self) -> list[str]:
        def job(conn: sqlite3.Connection) -> list[str]:
            return [str(row[0]) for row in conn.execute("SELECT key FROM usage_exempt ORDER BY key")]

        return await self.run_in_db(job)


def _usage_since(conn: sqlite3.Connection, key: str, kind: str, since: datetime) -> UsageTally:
    # Served by the covering index usage_hits_window alone.
    row = conn.execute(
        "SELECT count(*), coalesce(sum(amount), 0), min(at), max(at) FROM usage_hits"
        " WHERE key = ? AND kind = ? AND at >= ?",
        (key, kind, to_us(since)),
    ).fetchone()
    return tally(*row)
