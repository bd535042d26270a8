"""Migrations m012 onwards: places, analysed passage terms, working-context
lines, inbox owners. Append the next one here (or in a new module imported
after this one by memory/sqlite/migrations/__init__.py)."""

from __future__ import annotations

import logging
import sqlite3

from memory.sqlite.block_lines import place_block_lines
from memory.sqlite.migrations.registry import _run, migration
from memory.sqlite.terms import index_passages

log = logging.getLogger("memory.sqlite.migrations")


@migration
def m012_places(conn: sqlite3.Connection) -> None:
    # Places (memory/places.py): every message and passage records its
    # conversation key, and each place has its own queue and summary (the
    # conversations table). What was stored before has no known place: it
    # counts as "dm", the safe side (visible only in the person's DMs).
    _run(
        conn,
        "ALTER TABLE messages ADD COLUMN place TEXT NOT NULL DEFAULT 'dm'",
        "ALTER TABLE passages ADD COLUMN place TEXT NOT NULL DEFAULT 'dm'",
        # A place's queue (agent, place, seq >= start) and filtered counts.
        "CREATE INDEX messages_agent_place ON messages (agent_id, place, seq)",
        "CREATE INDEX passages_agent_place ON passages (agent_id, place)",
        """CREATE TABLE conversations (
            agent_id TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
            place TEXT NOT NULL,
            name TEXT NOT NULL DEFAULT '',
            summary TEXT NOT NULL DEFAULT '',
            queue_start_seq INTEGER NOT NULL DEFAULT 1,
            summary_updated_at REAL,
            PRIMARY KEY (agent_id, place)
        ) WITHOUT ROWID""",
        # Each agent's one queue becomes its DM conversation (collections,
        # `source:` records, have no queue).
        "INSERT INTO conversations (agent_id, place, summary, queue_start_seq, summary_updated_at)"
        " SELECT id, 'dm', summary, queue_start_seq, summary_updated_at FROM agents WHERE key NOT LIKE 'source:%'",
        # One source of truth for the queue state: the conversation.
        "ALTER TABLE agents DROP COLUMN summary",
        "ALTER TABLE agents DROP COLUMN queue_start_seq",
        "ALTER TABLE agents DROP COLUMN summary_updated_at",
    )
    rows = conn.execute(
        "SELECT a.key, (SELECT count(*) FROM messages m WHERE m.agent_id = a.id),"
        " (SELECT count(*) FROM passages p WHERE p.agent_id = a.id) FROM agents a"
        " WHERE a.key NOT LIKE 'source:%' ORDER BY a.created_at, a.rowid"
    ).fetchall()
    for key, messages, passages in rows:
        if messages or passages:
            log.info(
                "agent %s: %d messages and %d passages from before places count as DM-only", key, messages, passages
            )


# Passages read and indexed at a time by m013 (bounded memory on a large archive).
_REINDEX_BATCH = 1_000


@migration
def m013_passage_terms(conn: sqlite3.Connection) -> None:
    # Archival keyword search on analysed terms (memory/sqlite/terms.py):
    # stemmed, stop words out, identifiers whole, as conversation search. The
    # index holds that text, not passages.text, so it is a table of its own
    # (no external content), filled by the store on insert and emptied by a
    # trigger on delete; the passages already stored are re-indexed here.
    _run(
        conn,
        "DROP TRIGGER passages_fts_insert",
        "DROP TRIGGER passages_fts_delete",
        "DROP TRIGGER passages_fts_update",
        "DROP TABLE passages_fts",
        """CREATE VIRTUAL TABLE passages_fts USING fts5(
            agent_id, text, tokenize = "ascii tokenchars '_'"
        )""",
        # Fires for ON DELETE CASCADE too (an agent deleted).
        """CREATE TRIGGER passages_fts_delete AFTER DELETE ON passages BEGIN
            DELETE FROM passages_fts WHERE rowid = old.id;
        END""",
    )
    rows = conn.execute("SELECT id, agent_id, text FROM passages ORDER BY id")
    indexed = 0
    while batch := rows.fetchmany(_REINDEX_BATCH):
        indexed += index_passages(conn, batch)
    if indexed:
        log.info("re-indexed %d archival passages for keyword search by analysed terms", indexed)


@migration
def m014_block_lines(conn: sqlite3.Connection) -> None:
    # Working context by place (memory/working_context.py): a block's lines, each
    # with the place it was written from, as JSON; what blocks held before counts
    # as written in the DM, the safe side (memory/sqlite/block_lines.py).
    _run(conn, "ALTER TABLE blocks ADD COLUMN lines TEXT NOT NULL DEFAULT '[]'")
    place_block_lines(conn)
    _run(conn, "ALTER TABLE blocks DROP COLUMN value")


@migration
def m015_journal_owner(conn: sqlite3.Connection) -> None:
    # Several processes (bot/durable/inbox.py): the process holding an entry,
    # and whether it runs alone as a suspect (a death then counts against it).
    _run(
        conn,
        "ALTER TABLE event_journal ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE event_journal ADD COLUMN alone INTEGER NOT NULL DEFAULT 0",
    )


@migration
def m016_channel_lines(conn: sqlite3.Connection) -> None:
    # Channel memories (memory/channels.py): a pseudo-agent's messages, each
    # with who said it and when the platform last edited it; a speaker's lines
    # are found across channels (consent, forget) by a partial index that
    # people's own recall (speaker NULL) does not fill. Consent: one row per
    # speaker who chose.
    _run(
        conn,
        "ALTER TABLE messages ADD COLUMN speaker TEXT",
        "ALTER TABLE messages ADD COLUMN speaker_name TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE messages ADD COLUMN edited_at REAL",
        "CREATE INDEX messages_speaker ON messages (speaker, agent_id, seq) WHERE speaker IS NOT NULL",
        """CREATE TABLE channel_consent (
            speaker TEXT PRIMARY KEY,
            keep INTEGER NOT NULL,
            set_at REAL NOT NULL
        ) WITHOUT ROWID""",
    )


@migration
def m017_channel_modes(conn: sqlite3.Connection) -> None:
    # Channel modes (bot/channels/): what a channel's managers set with /channel
    # (NULL: the operator's setting holds), and when the bot said there that it
    # listens (NULL: not yet since it last stopped listening).
    _run(
        conn,
        """CREATE TABLE channel_modes (
            channel TEXT PRIMARY KEY,
            mode TEXT,
            set_at REAL,
            noticed_at REAL
        ) WITHOUT ROWID""",
    )
