"""SQLiteStore's inbox and reply outbox: the InboxStore role
(memory/roles.py), as a mixin of SQLiteStore. The stored names are older than the
word "inbox" and stay (no migration for a name): the inbox is the table
`event_journal`, and an entry's or a reply's platform is its `origin`.

Each call is one transaction on the store's worker thread, so an inbox entry,
an outbox reply or a state change is either wholly written or not at all.
Finished entries are kept a day (repeat deliveries are recognised meanwhile),
then swept: the inbox holds what people wrote, so it does not keep it longer
than it needs to.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from memory.sqlite.base import SQLiteBase
from memory.store import DEDUP_TTL, InboxEntry, OutboxEntry

_SWEEP_EVERY = 300.0  # seconds between sweeps of finished entries
_INBOX_COLS = (
    "event_id, origin, agent_key, payload, received_at, state, attempts, next_try_at, absorbed_into, owner, alone"
)
_OUTBOX_COLS = (
    "id, event_id, position, agent_key, origin, user_id, reply_to, text, created_at, state, attempts, next_try_at"
)


def _inbox_entry(row: Sequence[Any]) -> InboxEntry:
    return InboxEntry(
        row[0],
        row[1],
        row[2],
        json.loads(row[3]),
        datetime.fromtimestamp(row[4], UTC),
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        bool(row[10]),
    )


def _outbox(row: Sequence[Any]) -> OutboxEntry:
    return OutboxEntry(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        json.loads(row[6]),
        row[7],
        datetime.fromtimestamp(row[8], UTC),
        row[9],
        row[10],
        row[11],
    )


def event_message_seq_in(conn: sqlite3.Connection, agent_id: str, event_id: str) -> int | None:
    """The seq of the agent's first message recorded for `event_id`, if any."""
    # Named: without statistics SQLite's planner took the (agent_id, seq) key and read
    # every message of the agent, on every append (1.6 ms at 20,000 messages, on the
    # store's one thread); the partial index finds the event at once (0.002 ms).
    sql = "SELECT min(seq) FROM messages INDEXED BY messages_event WHERE agent_id = ? AND event_id = ?"
    row = conn.execute(sql, (agent_id, event_id)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def outbox_insert_in(conn: sqlite3.Connection, entry: OutboxEntry) -> bool:
    """Insert one outbox reply on `conn` (inside the caller's write transaction); False if its id is there already."""
    row = (
        entry.id,
        entry.event_id,
        entry.position,
        entry.agent_key,
        entry.platform,
        entry.user_id,
        json.dumps(entry.reply_to),
        entry.text,
        entry.created_at.timestamp(),
        entry.state,
        entry.attempts,
        entry.next_try_at,
    )
    sql = f"INSERT INTO outbox ({_OUTBOX_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
    return bool(conn.execute(sql, row).rowcount)


class SQLiteInbox(SQLiteBase):
    _last_inbox_sweep = 0.0

    async def inbox_receive(self, entry: InboxEntry) -> bool:
        now = time.time()
        sweep = now - self._last_inbox_sweep > _SWEEP_EVERY
        if sweep:
            self._last_inbox_sweep = now
        row = (
            entry.event_id,
            entry.platform,
            entry.agent_key,
            json.dumps(entry.payload, ensure_ascii=False),
            entry.received_at.timestamp(),
            entry.state,
            entry.attempts,
            entry.next_try_at,
            entry.absorbed_into,
            entry.owner,
            entry.alone,
        )

        def job(conn: sqlite3.Connection) -> bool:
            if sweep:
                cutoff = now - DEDUP_TTL
                conn.execute("DELETE FROM event_journal WHERE state = 'done' AND received_at < ?", (cutoff,))
                conn.execute("DELETE FROM outbox WHERE state <> 'pending' AND created_at < ?", (cutoff,))
            return bool(
                conn.execute(
                    f"INSERT INTO event_journal ({_INBOX_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (event_id) DO NOTHING",
                    row,
                ).rowcount
            )

        return await self.run_in_db(job, write=True)

    async def inbox_update(
        self,
        event_id: str,
        *,
        state: str | None = None,
        attempts: int | None = None,
        next_try_at: float | None = None,
        alone: bool | None = None,
        only_from: Collection[str] = (),
    ) -> bool:
        where, guard = "WHERE event_id = ?", tuple(only_from)
        if guard:
            where += f" AND state IN ({', '.join('?' * len(guard))})"

        def job(conn: sqlite3.Connection) -> bool:
            return bool(
                conn.execute(
                    "UPDATE event_journal SET state = coalesce(?, state), attempts = coalesce(?, attempts),"
                    f" next_try_at = coalesce(?, next_try_at), alone = coalesce(?, alone) {where}",
                    (state, attempts, next_try_at, alone, event_id, *guard),
                ).rowcount
            )

        return await self.run_in_db(job, write=True)

    async def inbox_start(self, event_id: str, *, alone: bool) -> bool:
        # No mark of a start kept: an append checks for the event's message in its own
        # transaction (SQLiteStore.append_messages), so knowing would save no round trip.
        await self.inbox_update(event_id, state="running", alone=alone, only_from=("pending",))
        return False

    async def inbox_pending(self, platform: str, due_by: float | None = None) -> list[InboxEntry]:
        # Without due_by: every unfinished entry; with it: the waiting ones due by then.
        where = "state <> 'done'" if due_by is None else "state = 'waiting' AND next_try_at <= ?"
        arguments = (platform,) if due_by is None else (platform, due_by)

        def job(conn: sqlite3.Connection) -> list[InboxEntry]:
            rows = conn.execute(
                f"SELECT {_INBOX_COLS} FROM event_journal WHERE origin = ? AND {where} ORDER BY n", arguments
            ).fetchall()
            return [_inbox_entry(row) for row in rows]

        return await self.run_in_db(job)

    async def inbox_entry(self, event_id: str) -> InboxEntry | None:
        def job(conn: sqlite3.Connection) -> InboxEntry | None:
            row = conn.execute(f"SELECT {_INBOX_COLS} FROM event_journal WHERE event_id = ?", (event_id,)).fetchone()
            return None if row is None else _inbox_entry(row)

        return await self.run_in_db(job)

    async def inbox_claim(self, event_id: str, from_owner: str, to_owner: str) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            # One statement in one transaction: of several claimers, one matches.
            sql = "UPDATE event_journal SET owner = ? WHERE event_id = ? AND owner = ?"
            return bool(conn.execute(sql, (to_owner, event_id, from_owner)).rowcount)

        return await self.run_in_db(job, write=True)

    async def inbox_absorb(self, leader_id: str, event_ids: Sequence[str]) -> None:
        def job(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "UPDATE event_journal SET absorbed_into = ? WHERE event_id = ?",
                [(leader_id, event_id) for event_id in event_ids],
            )

        await self.run_in_db(job, write=True)

    async def outbox_add(self, entry: OutboxEntry) -> bool:
        return await self.run_in_db(lambda conn: outbox_insert_in(conn, entry), write=True)

    async def outbox_update(
        self, entry_id: str, *, state: str, attempts: int | None = None, next_try_at: float | None = None
    ) -> None:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE outbox SET state = ?, attempts = coalesce(?, attempts),"
                " next_try_at = coalesce(?, next_try_at) WHERE id = ?",
                (state, attempts, next_try_at, entry_id),
            )

        await self.run_in_db(job, write=True)

    async def outbox_for_event(self, event_id: str) -> list[OutboxEntry]:
        def job(conn: sqlite3.Connection) -> list[OutboxEntry]:
            rows = conn.execute(
                f"SELECT {_OUTBOX_COLS} FROM outbox WHERE event_id = ? ORDER BY position", (event_id,)
            ).fetchall()
            return [_outbox(row) for row in rows]

        return await self.run_in_db(job)

    async def outbox_pending(self, platform: str, due_by: float | None = None) -> list[OutboxEntry]:
        def job(conn: sqlite3.Connection) -> list[OutboxEntry]:
            rows = conn.execute(
                f"SELECT {_OUTBOX_COLS} FROM outbox WHERE origin = ? AND state = 'pending'"
                " AND next_try_at <= ? ORDER BY created_at, event_id, position",
                (platform, float("inf") if due_by is None else due_by),
            ).fetchall()
            return [_outbox(row) for row in rows]

        return await self.run_in_db(job)

    async def inbox_scrub(self, agent_key: str, *, forgotten_at: datetime | None = None) -> None:
        # The rows are rewritten, not deleted (their ids drop repeat deliveries);
        # secure_delete zeroes the old cells, flush_deleted the WAL's copies.
        def job(conn: sqlite3.Connection) -> None:
            if forgotten_at is not None:
                before = (agent_key, forgotten_at.timestamp())
                conn.execute(
                    "UPDATE event_journal SET state = 'done', payload = '{}', agent_key = ''"
                    " WHERE agent_key = ? AND received_at <= ?",
                    before,
                )
                conn.execute(
                    "UPDATE outbox SET state = CASE state WHEN 'pending' THEN 'dropped' ELSE state END,"
                    " text = '', user_id = '', reply_to = '{}', agent_key = '' WHERE agent_key = ? AND created_at <= ?",
                    before,
                )
            conn.execute("UPDATE event_journal SET payload = '{}' WHERE agent_key = ? AND state = 'done'", (agent_key,))
            conn.execute("UPDATE outbox SET text = '' WHERE agent_key = ? AND state <> 'pending'", (agent_key,))

        await self.run_in_db(job, write=True)

    async def event_message_seq(self, agent_id: str, event_id: str) -> int | None:
        return await self.run_in_db(lambda conn: event_message_seq_in(conn, agent_id, event_id))
