"""SQLiteStore's agents, working context and FIFO queue state: the AgentStore
and BlockStore roles (memory/roles.py), as a mixin of SQLiteStore."""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from memory.places import DM_KEY
from memory.sqlite.base import SQLiteBase, from_ts, to_ts
from memory.sqlite.recall import MessageSearch
from memory.sqlite.search import PassageSearch
from memory.store import StoreError
from memory.types import AgentRecord, Block, ConversationRecord

log = logging.getLogger("memory.sqlite.store")

_AGENT_COLS = "id, key, created_at"
_BLOCKS_SQL = 'SELECT label, lines, "limit", updated_at FROM blocks WHERE agent_id = ? ORDER BY position'
# In the ConversationRecord field order.
_CONVERSATION_COLS = "agent_id, place, name, summary, queue_start_seq, summary_updated_at"


def _agent(row: Sequence[Any]) -> AgentRecord:
    return AgentRecord(row[0], row[1], from_ts(row[2]))


def _conversation(row: Sequence[Any]) -> ConversationRecord:
    summary_at = None if row[5] is None else from_ts(row[5])
    return ConversationRecord(row[0], row[1], row[2], row[3], row[4], summary_at)


def _block(row: Sequence[Any]) -> Block:
    return Block(row[0], limit=row[2], updated_at=from_ts(row[3]), lines=Block.lines_from_json(row[1]))


class SQLiteAgents(SQLiteBase):
    # The in-memory search indexes an agent's deletion must drop too.
    _search: PassageSearch
    _recall: MessageSearch

    # -- agents ------------------------------------------------------------
    async def get_or_create_agent(self, key: str, default_blocks: Sequence[Block]) -> tuple[AgentRecord, list[Block]]:
        return await self._call(self._get_or_create_agent, key, list(default_blocks))

    def _get_or_create_agent(self, key: str, default_blocks: list[Block]) -> tuple[AgentRecord, list[Block]]:
        now = time.time()
        with self._write() as conn:
            created = conn.execute(
                "INSERT INTO agents (id, key, created_at) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (uuid.uuid4().hex, key, now),
            ).rowcount
            row = conn.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE key = ?", (key,)).fetchone()
            if created:
                conn.executemany(
                    'INSERT INTO blocks (agent_id, label, lines, "limit", updated_at, position)'
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [(row[0], b.label, b.lines_json(), b.limit, now, n) for n, b in enumerate(default_blocks, 1)],
                )
            blocks = [_block(r) for r in conn.execute(_BLOCKS_SQL, (row[0],))]
        return _agent(row), blocks

    async def find_agent(self, key: str) -> AgentRecord | None:
        rows = await self._rows(f"SELECT {_AGENT_COLS} FROM agents WHERE key = ?", key)
        return _agent(rows[0]) if rows else None

    async def list_agents(self) -> list[AgentRecord]:
        sql = f"SELECT {_AGENT_COLS} FROM agents ORDER BY created_at, rowid"
        return [_agent(row) for row in await self._rows(sql)]

    async def delete_agent(self, agent_id: str) -> None:
        await self._call(self._delete_agent, agent_id)

    def _delete_agent(self, agent_id: str) -> None:
        with self._write() as conn:
            had_messages = conn.execute("SELECT 1 FROM messages WHERE agent_id = ? LIMIT 1", (agent_id,)).fetchone()
            had_passages = conn.execute("SELECT 1 FROM passages WHERE agent_id = ? LIMIT 1", (agent_id,)).fetchone()
            # Cascades to blocks, conversations, messages (whose trigger
            # empties the FTS rows) and passages.
            conn.execute("DELETE FROM agents WHERE id = ?", (agent_id,))
            if had_messages:
                # FTS5 before 3.44 keeps deleted terms in its segments until they
                # are merged; 'optimize' merges everything, so the words are gone
                # for real. Costs one index rewrite, acceptable for a rare call.
                conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
            if had_passages:
                conn.execute("INSERT INTO passages_fts (passages_fts) VALUES ('optimize')")
        self._search.forget(agent_id)
        self._recall.forget(agent_id)

    async def flush_deleted(self) -> None:
        await self._call(self._flush_deleted)

    def _flush_deleted(self) -> None:
        # The WAL still holds the pages as they were before the delete, and a
        # checkpoint alone leaves them there until overwritten: TRUNCATE copies
        # the new (secure_delete-zeroed) pages into the file and empties the WAL.
        # VACUUM first: it rewrites the file without the freed pages (a forgotten
        # archive otherwise keeps the file at its size), writing through the WAL.
        # Before it, the full-text indexes merge their segments: FTS5 keeps a
        # deleted message's terms in them until then (a topic forget deletes a few).
        with self._write() as conn:
            for index in ("messages_fts", "passages_fts"):
                conn.execute(f"INSERT INTO {index} ({index}) VALUES ('optimize')")
        try:
            self._db.execute("VACUUM")
        except sqlite3.OperationalError as error:  # another connection is writing: the space waits for the next forget
            log.warning("SQLite store %s: could not reclaim the freed space (VACUUM: %s)", self.path, error)
        busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:  # another process reads an old snapshot: the old pages stay in the WAL until it is reused
            log.warning("SQLite store %s: the WAL could not be emptied after a forget (a reader is busy)", self.path)

    # -- working context ---------------------------------------------------
    async def load_blocks(self, agent_id: str) -> list[Block]:
        return [_block(row) for row in await self._rows(_BLOCKS_SQL, agent_id)]

    async def save_block(self, agent_id: str, block: Block) -> None:
        await self._call(self._save_block, agent_id, block)

    def _save_block(self, agent_id: str, block: Block) -> None:
        with self._write() as conn:
            # A new label goes last; an existing one keeps its place.
            conn.execute(
                'INSERT INTO blocks (agent_id, label, lines, "limit", updated_at, position)'
                " VALUES (?, ?, ?, ?, ?,"
                " (SELECT coalesce(max(position), 0) + 1 FROM blocks WHERE agent_id = ?))"
                " ON CONFLICT (agent_id, label) DO UPDATE SET lines = excluded.lines,"
                ' "limit" = excluded."limit", updated_at = excluded.updated_at',
                (agent_id, block.label, block.lines_json(), block.limit, to_ts(block.updated_at), agent_id),
            )

    # -- conversations: each place's FIFO queue state ------------------------
    async def get_conversation(self, agent_id: str, place: str, name: str = "") -> ConversationRecord:
        return await self._call(self._get_conversation, agent_id, place, name)

    def _get_conversation(self, agent_id: str, place: str, name: str) -> ConversationRecord:
        with self._write() as conn:
            self._known_agent(conn, agent_id)
            conn.execute(
                "INSERT INTO conversations (agent_id, place, name) VALUES (?, ?, ?)"
                " ON CONFLICT (agent_id, place) DO UPDATE SET name = excluded.name"
                " WHERE excluded.name <> '' AND excluded.name <> name",
                (agent_id, place, name),
            )
            row = conn.execute(
                f"SELECT {_CONVERSATION_COLS} FROM conversations WHERE agent_id = ? AND place = ?", (agent_id, place)
            ).fetchone()
        return _conversation(row)

    async def list_conversations(self, agent_id: str) -> list[ConversationRecord]:
        sql = f"SELECT {_CONVERSATION_COLS} FROM conversations WHERE agent_id = ? ORDER BY place"
        return [_conversation(row) for row in await self._rows(sql, agent_id)]

    async def update_queue(
        self,
        agent_id: str,
        summary: str,
        queue_start_seq: int,
        summary_updated_at: datetime,
        *,
        place: str = DM_KEY,
    ) -> None:
        await self._call(self._update_queue, agent_id, place, summary, queue_start_seq, to_ts(summary_updated_at))

    def _update_queue(self, agent_id: str, place: str, summary: str, start: int, updated: float) -> None:
        with self._write() as conn:
            self._known_agent(conn, agent_id)
            conn.execute(
                "INSERT INTO conversations (agent_id, place, summary, queue_start_seq, summary_updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (agent_id, place) DO UPDATE SET summary = excluded.summary,"
                " queue_start_seq = excluded.queue_start_seq, summary_updated_at = excluded.summary_updated_at",
                (agent_id, place, summary, start, updated),
            )

    def _known_agent(self, conn: sqlite3.Connection, agent_id: str) -> None:
        if conn.execute("SELECT 1 FROM agents WHERE id = ?", (agent_id,)).fetchone() is None:
            raise StoreError(f"SQLite store {self.path}: no agent {agent_id!r}")
