"""Migrations m001-m011: the schema before places (shipped; never edit one)."""

from __future__ import annotations

import sqlite3

from memory.sqlite.migrations.registry import _run, migration


@migration
def m001_initial(conn: sqlite3.Connection) -> None:
    _run(
        conn,
        """CREATE TABLE agents (
            id TEXT PRIMARY KEY,
            key TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL,
            summary TEXT NOT NULL DEFAULT '',
            queue_start_seq INTEGER NOT NULL DEFAULT 1,
            summary_updated_at REAL
        )""",
        # `position` (not rowid) keeps block order stable: VACUUM may renumber
        # rowids of tables without an INTEGER PRIMARY KEY.
        """CREATE TABLE blocks (
            agent_id TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
            label TEXT NOT NULL,
            value TEXT NOT NULL,
            "limit" INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            position INTEGER NOT NULL,
            PRIMARY KEY (agent_id, label)
        )""",
        # An explicit INTEGER PRIMARY KEY gives each message a rowid that VACUUM
        # keeps, because the FTS index refers to messages by that rowid.
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            agent_id TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT,
            tool_calls TEXT,
            tool_call_id TEXT,
            name TEXT,
            created_at REAL NOT NULL,
            UNIQUE (agent_id, seq)
        )""",
        "CREATE INDEX messages_agent_created ON messages (agent_id, created_at)",
        # agent_id is an indexed FTS column so a search intersects the posting
        # lists inside FTS5 instead of filtering every agent's hits afterwards.
        """CREATE VIRTUAL TABLE messages_fts USING fts5(
            agent_id, text, tokenize = 'unicode61 remove_diacritics 2'
        )""",
        # Fires for ON DELETE CASCADE too, so deleting an agent empties its FTS rows.
        """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
            DELETE FROM messages_fts WHERE rowid = old.id;
        END""",
        """CREATE TABLE passages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            agent_id TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
            text TEXT NOT NULL,
            source TEXT,
            position TEXT,
            created_at REAL NOT NULL,
            embedding BLOB
        )""",
        "CREATE INDEX passages_agent_created ON passages (agent_id, created_at)",
        # Partial index: the embedding backlog is found without scanning done rows.
        "CREATE INDEX passages_pending ON passages (agent_id) WHERE embedding IS NULL",
    )


@migration
def m002_checkin_schedules(conn: sqlite3.Connection) -> None:
    # Times are INTEGER unix seconds (not REAL like the tables above): claim()
    # compares next_fire_at for equality, which must be exact.
    _run(
        conn,
        """CREATE TABLE schedules (
            id TEXT PRIMARY KEY,
            agent_key TEXT NOT NULL,
            platform TEXT NOT NULL,
            user_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            timezone TEXT NOT NULL,
            time_of_day TEXT,
            weekday INTEGER,
            every_hours INTEGER,
            run_at INTEGER,
            quiet_start TEXT,
            quiet_end TEXT,
            note TEXT NOT NULL DEFAULT '',
            reply_to TEXT NOT NULL DEFAULT '{}',
            paused INTEGER NOT NULL DEFAULT 0,
            next_fire_at INTEGER,
            unanswered INTEGER NOT NULL DEFAULT 0,
            last_fired_at INTEGER,
            created_at INTEGER NOT NULL,
            claimed_by TEXT
        )""",
        "CREATE INDEX schedules_agent_key ON schedules (agent_key)",
        # Partial index: finding due ticks never scans paused schedules.
        "CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE paused = 0",
        """CREATE TABLE checkin_prefs (
            agent_key TEXT PRIMARY KEY,
            timezone TEXT,
            quiet_start TEXT,
            quiet_end TEXT,
            updated_at INTEGER NOT NULL
        )""",
    )


@migration
def m003_shared_collections(conn: sqlite3.Connection) -> None:
    _run(
        conn,
        # A collection's passages live under its own agent record (key
        # `source:NAME`); deleting that record deletes the collection.
        """CREATE TABLE sources (
            agent_id TEXT PRIMARY KEY REFERENCES agents(id) ON DELETE CASCADE,
            name TEXT NOT NULL UNIQUE,
            attach_all INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL
        )""",
        # attached = 0 records a detach that overrides sources.attach_all.
        """CREATE TABLE source_attachments (
            agent_id TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
            source_id TEXT NOT NULL REFERENCES sources(agent_id) ON DELETE CASCADE,
            attached INTEGER NOT NULL,
            PRIMARY KEY (agent_id, source_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX source_attachments_source ON source_attachments (source_id)",
        # Files loaded completely; a re-load of the same bytes is skipped.
        """CREATE TABLE documents (
            agent_id TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
            sha256 TEXT NOT NULL,
            name TEXT NOT NULL,
            passages INTEGER NOT NULL,
            loaded_at REAL NOT NULL,
            PRIMARY KEY (agent_id, sha256)
        ) WITHOUT ROWID""",
        # Per-passage content hashes: what makes an interrupted load resumable
        # without duplicates. Cascades from passages, so a deleted passage can
        # be loaded again.
        """CREATE TABLE passage_hashes (
            agent_id TEXT NOT NULL,
            hash TEXT NOT NULL,
            passage_id INTEGER NOT NULL REFERENCES passages(id) ON DELETE CASCADE,
            PRIMARY KEY (agent_id, hash)
        ) WITHOUT ROWID""",
        # Without it every deleted passage would scan the whole table for its hash.
        "CREATE INDEX passage_hashes_passage ON passage_hashes (passage_id)",
    )


@migration
def m004_passages_fts(conn: sqlite3.Connection) -> None:
    _run(
        conn,
        # Keyword half of hybrid archival search. External content: the text is
        # stored once (in passages) and the index holds only its tokens. The
        # agent_id column lets a small archive be searched inside FTS5 without
        # touching other agents' hits; the tokenizer matches messages_fts.
        """CREATE VIRTUAL TABLE passages_fts USING fts5(
            agent_id, text, content = 'passages', content_rowid = 'id',
            tokenize = 'unicode61 remove_diacritics 2'
        )""",
        """CREATE TRIGGER passages_fts_insert AFTER INSERT ON passages BEGIN
            INSERT INTO passages_fts (rowid, agent_id, text) VALUES (new.id, new.agent_id, new.text);
        END""",
        # An external-content index must be told the old values to forget them;
        # this fires for ON DELETE CASCADE (agent deleted) too.
        """CREATE TRIGGER passages_fts_delete AFTER DELETE ON passages BEGIN
            INSERT INTO passages_fts (passages_fts, rowid, agent_id, text)
            VALUES ('delete', old.id, old.agent_id, old.text);
        END""",
        """CREATE TRIGGER passages_fts_update AFTER UPDATE OF agent_id, text ON passages BEGIN
            INSERT INTO passages_fts (passages_fts, rowid, agent_id, text)
            VALUES ('delete', old.id, old.agent_id, old.text);
            INSERT INTO passages_fts (rowid, agent_id, text) VALUES (new.id, new.agent_id, new.text);
        END""",
        # Index the passages stored before this migration.
        "INSERT INTO passages_fts (passages_fts) VALUES ('rebuild')",
    )


@migration
def m005_process_coordination(conn: sqlite3.Connection) -> None:
    # Several bot processes on one database file (see bot/durable/leases.py).
    _run(
        conn,
        # Platform event ids already handled, kept a day (replaced by the inbox: see below).
        """CREATE TABLE delivered_events (
            event_id TEXT PRIMARY KEY,
            seen_at REAL NOT NULL
        ) WITHOUT ROWID""",
        "CREATE INDEX delivered_events_seen ON delivered_events (seen_at)",
        # Bot processes taking part in leases, alive while their heartbeat is renewed.
        """CREATE TABLE lease_owners (
            owner TEXT PRIMARY KEY,
            expires_at REAL NOT NULL
        ) WITHOUT ROWID""",
        # Each agent's line of events waiting for or holding its lease: the
        # lowest live ticket (not done, owner alive) holds it.
        """CREATE TABLE lease_tickets (
            name TEXT NOT NULL,
            seq INTEGER NOT NULL,
            owner TEXT NOT NULL,
            done INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (name, seq)
        ) WITHOUT ROWID""",
        # Who held each agent's lease last: a process that finds someone else
        # there reloads the agent from the store.
        """CREATE TABLE lease_holders (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL
        ) WITHOUT ROWID""",
    )


@migration
def m006_message_embeddings(conn: sqlite3.Connection) -> None:
    # Recall messages are embedded lazily, the first time their agent searches
    # recall (memory/recall.py). ADD COLUMN only writes the schema: existing
    # rows read the column as NULL, so a large history migrates instantly.
    _run(
        conn,
        "ALTER TABLE messages ADD COLUMN embedding BLOB",
        # The embedding backlog, newest first, without scanning embedded rows.
        # Same condition as sqlite_recall.PENDING_WHERE, so the planner uses it.
        "CREATE INDEX messages_unembedded ON messages (agent_id, seq)"
        " WHERE embedding IS NULL AND role IN ('user', 'assistant') AND content <> ''"
        " AND coalesce(name, '') <> 'system_alert'",
    )


@migration
def m007_event_journal(conn: sqlite3.Connection) -> None:
    # Crash safety (bot/durable/inbox.py): inbound events recorded before they are
    # acknowledged, replies recorded before they are sent.
    _run(
        conn,
        # n: arrival order (rowid), which redo follows.
        """CREATE TABLE event_journal (
            n INTEGER PRIMARY KEY,
            event_id TEXT NOT NULL UNIQUE,
            origin TEXT NOT NULL,
            agent_key TEXT NOT NULL,
            payload TEXT NOT NULL,
            state TEXT NOT NULL,
            received_at REAL NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX event_inbox_pending ON event_journal (origin, n) WHERE state = 'pending'",
        "CREATE INDEX event_inbox_received ON event_journal (received_at)",
        "CREATE INDEX event_journal_key ON event_journal (agent_key)",
        """CREATE TABLE outbox (
            id TEXT PRIMARY KEY,
            event_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            agent_key TEXT NOT NULL,
            origin TEXT NOT NULL,
            user_id TEXT NOT NULL,
            reply_to TEXT NOT NULL,
            text TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_try_at REAL NOT NULL DEFAULT 0
        ) WITHOUT ROWID""",
        "CREATE INDEX outbox_event ON outbox (event_id, position)",
        "CREATE INDEX outbox_pending ON outbox (origin, created_at) WHERE state = 'pending'",
        "CREATE INDEX outbox_created ON outbox (created_at)",
        "CREATE INDEX outbox_key ON outbox (agent_key)",
        # Which recall message records an event, so a redo never records it twice.
        "ALTER TABLE messages ADD COLUMN event_id TEXT",
        "CREATE INDEX messages_event ON messages (agent_id, event_id) WHERE event_id IS NOT NULL",
    )


@migration
def m008_usage_limits(conn: sqlite3.Connection) -> None:
    # Per-user message rate and daily token budget (bot/limits.py): one row per
    # hit, counted or summed over a window, swept once older than a day or two.
    _run(
        conn,
        # `at`: integer microseconds since the epoch, so instants come back exact.
        """CREATE TABLE usage_hits (
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL,
            kind TEXT NOT NULL,
            at INTEGER NOT NULL,
            amount INTEGER NOT NULL
        )""",
        # Covering: a window's count and sum are read from the index alone.
        "CREATE INDEX usage_hits_window ON usage_hits (key, kind, at, amount)",
        "CREATE INDEX usage_hits_at ON usage_hits (at)",
        # Users the admin exempted (`memgpt-bot limits exempt`).
        """CREATE TABLE usage_exempt (
            key TEXT PRIMARY KEY,
            since INTEGER NOT NULL
        ) WITHOUT ROWID""",
    )


@migration
def m009_drop_delivered_events(conn: sqlite3.Connection) -> None:
    # Repeat deliveries are recognised by the inbox's key now
    # (Store.inbox_receive): the table of delivered event ids is not used.
    _run(conn, "DROP TABLE delivered_events")


@migration
def m010_journal_running_and_waiting(conn: sqlite3.Connection) -> None:
    # The durable-event pipeline (bot/durable/): an entry is "running" once work
    # on it starts (only those count as restarts), and "waiting" for a replay at
    # next_try_at after storage failed it. Every state but "done" is unfinished.
    _run(
        conn,
        "ALTER TABLE event_journal ADD COLUMN next_try_at REAL NOT NULL DEFAULT 0",
        "DROP INDEX event_inbox_pending",
        "CREATE INDEX event_journal_unfinished ON event_journal (origin, n) WHERE state <> 'done'",
    )


@migration
def m011_inbox_absorbed_into(conn: sqlite3.Connection) -> None:
    # Debounced messages (bot/durable/debounce.py): an entry handled as part
    # of an earlier one's batch names that entry; "" when handled on its own.
    _run(conn, "ALTER TABLE event_journal ADD COLUMN absorbed_into TEXT NOT NULL DEFAULT ''")
