"""The data side of migration m014 (memory/sqlite/migrations.py): each
block's text, stored before lines had places, becomes its lines written in
the DM (memory/working_context.py lines_from_before_places), one log line per
agent that had any."""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime

from memory.places import DM_KEY
from memory.types import Block
from memory.working_context import lines_from_before_places

log = logging.getLogger("memory.sqlite.migrations")


def place_block_lines(conn: sqlite3.Connection) -> None:
    rows = conn.execute(
        "SELECT b.agent_id, b.label, b.value, b.updated_at, a.key FROM blocks b JOIN agents a ON a.id = b.agent_id"
        " ORDER BY a.created_at, a.rowid, b.position"
    ).fetchall()
    in_dm: dict[str, int] = {}
    for agent_id, label, value, updated_at, key in rows:
        lines = lines_from_before_places(value, datetime.fromtimestamp(updated_at, UTC))
        record = Block(label, limit=0, lines=lines).lines_json()
        conn.execute("UPDATE blocks SET lines = ? WHERE agent_id = ? AND label = ?", (record, agent_id, label))
        in_dm[key] = in_dm.get(key, 0) + sum(line.place == DM_KEY for line in lines)
    for key, count in in_dm.items():
        if count:
            log.info("agent %s: %d working-context lines from before places count as written in the DM", key, count)
