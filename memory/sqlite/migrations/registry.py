"""The machinery of SQLite schema versioning (see memory/sqlite/migrations/__init__.py):
the ordered list, the decorator that numbers and registers a migration, and
`migrate`, which runs the ones a database has not recorded."""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("memory.sqlite.migrations")

Migration = Callable[[sqlite3.Connection], None]

MIGRATIONS: list[Migration] = []

# Function name -> the name the migration was shipped and is recorded under.
RECORDED_AS: Mapping[str, str] = {
    "m002_checkin_schedules": "m_checkin_schedules",
    "m003_shared_collections": "m_shared_collections",
    "m004_passages_fts": "m_passages_fts",
    "m005_process_coordination": "m_process_coordination",
    "m006_message_embeddings": "m_message_embeddings",
    "m007_event_journal": "m_event_journal",
    "m008_usage_limits": "m_usage_limits",
    "m009_drop_delivered_events": "m_drop_delivered_events",
    "m010_journal_running_and_waiting": "m_journal_running_and_waiting",
}

_NUMBERED = re.compile(r"m(\d{3})_\w+")


def migration(fn: Migration) -> Migration:
    """Register `fn` as the next migration of the store schema. Its name must
    carry the next number: a misnumbered one fails at import, not in the field."""
    expected = len(MIGRATIONS) + 1
    match = _NUMBERED.fullmatch(fn.__name__)
    if match is None or int(match.group(1)) != expected:
        raise ValueError(f"migration {fn.__name__} must be named m{expected:03d}_<what it does>")
    MIGRATIONS.append(fn)
    return fn


def recorded_name(fn: Migration) -> str:
    """The name `fn` is recorded under in `_migrations`."""
    return RECORDED_AS.get(fn.__name__, fn.__name__)


def migrate(conn: sqlite3.Connection, migrations: Sequence[Migration] = MIGRATIONS) -> list[str]:
    """Apply every migration not yet recorded; returns the names applied now.

    The connection must be in autocommit mode (isolation_level=None) so that
    each migration and its bookkeeping row commit together or not at all.
    """
    conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    applied_now: list[str] = []
    for fn in migrations:
        name = recorded_name(fn)
        # BEGIN IMMEDIATE takes the write lock before the check, so two
        # processes opening the same new file cannot both run a migration.
        conn.execute("BEGIN IMMEDIATE")
        with conn:
            done = conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)).fetchone()
            if done:
                continue
            fn(conn)
            conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, time.time()))
        applied_now.append(name)
    return applied_now


def _run(conn: sqlite3.Connection, *statements: str) -> None:
    # Not executescript(): it commits first, which would break the per-migration
    # transaction that migrate() holds open.
    for statement in statements:
        conn.execute(statement)
