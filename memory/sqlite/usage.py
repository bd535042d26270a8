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
        values = [value for kind, amount in hits.items() for value in (key, kind, to_us(at), int(amount))]
        # One statement for all the hits (one step on the worker, not one per row).
        sql = "INSERT INTO usage_hits (key, kind, at, amount) VALUES " + ", ".join(["(?, ?, ?, ?)"] * len(hits))

        def job(conn: sqlite3.Connection) -> None:
            if values:
                conn.execute(sql, values)

        await self.run_in_db(job, write=True)

    async def usage_since(self, key: str, kind: str, since: datetime) -> UsageTally:
        return (await self.usage_windows(key, [(kind, since)]))[0]

    async def usage_windows(self, key: str, windows: Sequence[tuple[str, datetime]]) -> list[UsageTally]:
        if not windows:
            return []
        # One statement, a row per window.
        sql = " UNION ALL ".join(f"SELECT {n}, {_TALLY}" for n in range(len(windows))) + " ORDER BY 1"
        args = [value for kind, since in windows for value in (key, kind, to_us(since))]

        def job(conn: sqlite3.Connection) -> list[UsageTally]:
            return [tally(*row[1:]) for row in conn.execute(sql, args).fetchall()]

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


# One window's tally, served by the covering index usage_hits_window alone.
_TALLY = "count(*), coalesce(sum(amount), 0), min(at), max(at) FROM usage_hits WHERE key = ? AND kind = ? AND at >= ?"
