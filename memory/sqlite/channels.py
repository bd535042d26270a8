"""SQLiteStore's side of channel memories: the ChannelStore role
(memory/roles.py), as a mixin of SQLiteStore. A channel's lines are rows of
`messages` (of the channel's pseudo-agent) with a `speaker`; the FTS row of a
deleted line goes with it (trigger messages_fts_delete), its embedding is in
the row, and the in-memory ranking index of every channel touched is dropped,
to be read again from what is left (memory/sqlite/recall.py)."""

from __future__ import annotations

import json
import sqlite3
from abc import abstractmethod
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from memory.sqlite.base import SQLiteBase, from_ts, to_ts
from memory.sqlite.recall import MessageSearch
from memory.types import Message, prefix_end


class SQLiteChannels(SQLiteBase):
    _recall: MessageSearch
    _message_columns: str

    @staticmethod
    @abstractmethod
    def _message_of(row: Sequence[Any]) -> Message: ...

    async def edit_message(self, agent_id: str, event_id: str, content: str, edited_at: datetime) -> bool:
        def edit(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                f"SELECT id, {self._message_columns} FROM messages WHERE agent_id = ? AND event_id = ?",
                (agent_id, event_id),
            ).fetchone()
            if row is None:
                return False
            message = self._message_of(row[1:])
            message.content = content
            conn.execute(
                "UPDATE messages SET content = ?, edited_at = ?, embedding = NULL WHERE id = ?",
                (content, to_ts(edited_at), row[0]),
            )
            # The keyword row is the text as said: replaced whole (the old terms go at the next merge).
            conn.execute("DELETE FROM messages_fts WHERE rowid = ?", (row[0],))
            conn.execute(
                "INSERT INTO messages_fts (rowid, agent_id, text) VALUES (?, ?, ?)",
                (row[0], agent_id, message.searchable_text()),
            )
            self._recall.forget(agent_id)
            return True

        return await self.run_in_db(edit, write=True)

    async def delete_event_messages(self, agent_id: str, event_ids: Sequence[str]) -> int:
        if not event_ids:
            return 0
        wanted = json.dumps(sorted(set(event_ids)))
        where = "agent_id = ? AND event_id IN (SELECT value FROM json_each(?))"
        return await self._delete_where(where, agent_id, wanted)

    async def speaker_messages(self, speaker: str, *, agent_id: str | None = None) -> list[tuple[str, Message]]:
        columns = ", ".join(f"m.{column}" for column in self._message_columns.split(", "))
        where, args = _speaker_where(speaker, agent_id, "m.")
        sql = (
            f"SELECT a.key, {columns} FROM messages m JOIN agents a ON a.id = m.agent_id"
            f" WHERE {where} ORDER BY a.key, m.seq"
        )
        return [(row[0], self._message_of(row[1:])) for row in await self._rows(sql, *args)]

    async def speaker_message_counts(self, speaker: str) -> dict[str, int]:
        sql = (
            "SELECT a.key, count(*) FROM messages m JOIN agents a ON a.id = m.agent_id"
            " WHERE m.speaker = ? GROUP BY a.key ORDER BY a.key"
        )
        return {key: int(count) for key, count in await self._rows(sql, speaker)}

    async def delete_speaker_messages(self, speaker: str, *, agent_id: str | None = None) -> int:
        where, args = _speaker_where(speaker, agent_id)
        return await self._delete_where(where, *args)

    async def prune_messages(self, key_prefix: str, before: datetime) -> int:
        agents = "SELECT id FROM agents WHERE key >= ? AND key < ?"
        return await self._delete_where(
            f"agent_id IN ({agents}) AND created_at < ?", key_prefix, prefix_end(key_prefix), to_ts(before)
        )

    async def _delete_where(self, where: str, *args: Any) -> int:
        """Delete the messages matching `where` (FTS rows by trigger, embeddings
        in the rows) and drop the ranking index of each agent that lost some."""

        def delete(conn: sqlite3.Connection) -> int:
            agents = [row[0] for row in conn.execute(f"SELECT DISTINCT agent_id FROM messages WHERE {where}", args)]
            deleted = conn.execute(f"DELETE FROM messages WHERE {where}", args).rowcount if agents else 0
            for agent_id in agents:
                self._recall.forget(agent_id)
            return int(deleted)

        return await self.run_in_db(delete, write=True)

    async def set_channel_consent(self, speaker: str, keep: bool | None, at: datetime) -> None:
        def record(conn: sqlite3.Connection) -> None:
            if keep is None:
                conn.execute("DELETE FROM channel_consent WHERE speaker = ?", (speaker,))
                return
            conn.execute(
                "INSERT INTO channel_consent (speaker, keep, set_at) VALUES (?, ?, ?)"
                " ON CONFLICT (speaker) DO UPDATE SET keep = excluded.keep, set_at = excluded.set_at",
                (speaker, int(keep), to_ts(at)),
            )

        await self.run_in_db(record, write=True)

    async def channel_consent(self, speakers: Collection[str]) -> dict[str, bool]:
        if not speakers:
            return {}
        sql = "SELECT speaker, keep FROM channel_consent WHERE speaker IN (SELECT value FROM json_each(?))"
        return {speaker: bool(keep) for speaker, keep in await self._rows(sql, json.dumps(sorted(set(speakers))))}

    async def list_channel_consent(self) -> list[tuple[str, bool, datetime]]:
        rows = await self._rows("SELECT speaker, keep, set_at FROM channel_consent ORDER BY speaker")
        return [(speaker, bool(keep), from_ts(at)) for speaker, keep, at in rows]

    async def set_channel_mode(self, channel: str, mode: str, at: datetime) -> None:
        sql = (
            "INSERT INTO channel_modes (channel, mode, set_at, noticed_at) VALUES (?, ?, ?, NULL)"
            " ON CONFLICT (channel) DO UPDATE SET mode = excluded.mode, set_at = excluded.set_at,"
            " noticed_at = CASE WHEN excluded.mode = 'mention' THEN NULL ELSE noticed_at END"
        )

        def record(conn: sqlite3.Connection) -> None:
            conn.execute(sql, (channel, mode, to_ts(at)))

        await self.run_in_db(record, write=True)

    async def channel_mode(self, channel: str) -> str | None:
        rows = await self._rows("SELECT mode FROM channel_modes WHERE channel = ?", channel)
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    async def claim_channel_notice(self, channel: str, at: datetime) -> bool:
        # One statement: the row is written only where nobody noticed yet, so of two
        # processes claiming at once exactly one changes it.
        sql = (
            "INSERT INTO channel_modes (channel, mode, set_at, noticed_at) VALUES (?, NULL, NULL, ?)"
            " ON CONFLICT (channel) DO UPDATE SET noticed_at = excluded.noticed_at"
            " WHERE channel_modes.noticed_at IS NULL"
        )

        def claim(conn: sqlite3.Connection) -> bool:
            return conn.execute(sql, (channel, to_ts(at))).rowcount == 1

        return await self.run_in_db(claim, write=True)


def _speaker_where(speaker: str, agent_id: str | None, alias: str = "") -> tuple[str, tuple[str, ...]]:
    """The condition on messages for the lines of `speaker` (in one agent, or in all), and its arguments."""
    if agent_id is None:
        return f"{alias}speaker = ?", (speaker,)
    return f"{alias}speaker = ? AND {alias}agent_id = ?", (speaker, agent_id)
