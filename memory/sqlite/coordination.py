"""SQLiteStore's share of coordinating several bot processes on one database
file: the LeaseStore role (memory/roles.py), as a mixin of SQLiteStore.

Every write is one transaction (BEGIN IMMEDIATE, through `run_in_db`), so
SQLite's own lock makes each read-then-write atomic across processes: a
ticket's number is simply max + 1. The protocol built on these calls is told
in bot/durable/leases.py; the MongoDB twin (memory/mongo/coordination.py) keeps the
same rules without transactions, and clean-up follows its rule here too (a
name's highest ticket is never deleted) so both backends behave alike.

All processes sharing a file share the machine's clocks: owners expire on the
monotonic clock (system-wide, never stepped by NTP, restarted by a reboot, which
lease_register cleans up after); delivered event ids are dated by the wall clock.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection, Sequence

from memory.sqlite.base import SQLiteBase

# Finished tickets are cleared away when one numbered a multiple of this leaves
# (a few writes fewer per event; at most this many wait per agent).
CLEAR_EVERY = 8


def position(ahead: Sequence[tuple[int, str]], seq: int, owner: str, live_owners: set[str]) -> int | None:
    """lease_position from the tickets numbered <= seq that are not done,
    highest first, and the owners among them that are alive."""
    if not ahead or tuple(ahead[0]) != (seq, owner) or owner not in live_owners:
        return None
    return sum(1 for _, other in ahead[1:] if other in live_owners)


class SQLiteCoordination(SQLiteBase):
    async def _store_clock(self) -> float:
        """The store's clock: this machine's, shared by every process on the file."""
        return time.time()

    # -- agent leases --------------------------------------------------------
    async def lease_register(self, owner: str, ttl: float) -> None:
        def job(conn: sqlite3.Connection) -> None:
            now = time.monotonic()
            # Owners dead for a while go (a missing owner counts as dead), and so
            # do impossible ones: from before a reboot, when the clock restarted.
            conn.execute("DELETE FROM lease_owners WHERE expires_at < ? OR expires_at > ?", (now - ttl, now + ttl))
            conn.execute("INSERT INTO lease_owners (owner, expires_at) VALUES (?, ?)", (owner, now + ttl))

        await self.run_in_db(job, write=True)

    async def lease_renew(self, owner: str, ttl: float) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            now = time.monotonic()
            # An expired owner is never renewed: others may already have
            # passed its tickets (see bot/durable/leases.py).
            sql = "UPDATE lease_owners SET expires_at = ? WHERE owner = ? AND expires_at >= ?"
            return bool(conn.execute(sql, (now + ttl, owner, now)).rowcount)

        return await self.run_in_db(job, write=True)

    async def lease_join(self, name: str, owner: str) -> int:
        def job(conn: sqlite3.Connection) -> int:
            (seq,) = conn.execute(
                "INSERT INTO lease_tickets (name, seq, owner)"
                " SELECT ?, coalesce(max(seq), 0) + 1, ? FROM lease_tickets WHERE name = ? RETURNING seq",
                (name, owner, name),
            ).fetchone()
            return int(seq)

        return await self.run_in_db(job, write=True)

    async def lease_position(self, name: str, seq: int, owner: str) -> int | None:
        def job(conn: sqlite3.Connection) -> int | None:
            ahead = conn.execute(
                "SELECT seq, owner FROM lease_tickets WHERE name = ? AND seq <= ? AND done = 0 ORDER BY seq DESC",
                (name, seq),
            ).fetchall()
            owners = sorted({other for _, other in ahead})
            live = conn.execute(
                f"SELECT owner FROM lease_owners WHERE expires_at >= ? AND owner IN ({', '.join('?' * len(owners))})",
                (time.monotonic(), *owners),
            ).fetchall()
            return position(ahead, seq, owner, {row[0] for row in live})

        # A read: dead tickets ahead are cleared by lease_leave, not here (no write lock needed).
        return await self.run_in_db(job)

    async def lease_leave(self, name: str, seq: int, owner: str) -> None:
        def job(conn: sqlite3.Connection) -> None:
            where = "name = ? AND seq = ? AND owner = ?"
            conn.execute(f"UPDATE lease_tickets SET done = 1 WHERE {where}", (name, seq, owner))
            if seq % CLEAR_EVERY:
                return
            # The highest ticket stays, so numbers only grow: the rule MongoDB
            # needs (no transactions there), kept here so both behave alike.
            conn.execute(
                "DELETE FROM lease_tickets WHERE name = ?"
                " AND (done = 1 OR owner NOT IN (SELECT owner FROM lease_owners WHERE expires_at >= ?))"
                " AND seq < (SELECT max(seq) FROM lease_tickets WHERE name = ?)",
                (name, time.monotonic(), name),
            )

        await self.run_in_db(job, write=True)

    async def lease_live(self, owners: Collection[str]) -> set[str]:
        wanted = sorted(set(owners))

        def job(conn: sqlite3.Connection) -> set[str]:
            rows = conn.execute(
                f"SELECT owner FROM lease_owners WHERE expires_at >= ? AND owner IN ({', '.join('?' * len(wanted))})",
                (time.monotonic(), *wanted),
            ).fetchall()
            return {row[0] for row in rows}

        return await self.run_in_db(job) if wanted else set()
