"""SQLiteStore's shared collections and loaded documents: the SourceStore and
DocumentStore roles (memory/roles.py), as a mixin of SQLiteStore. A
collection's passages live under its own agent record (key `source:NAME`), so
they are stored and searched as any agent's."""

from __future__ import annotations

import json
import time
import uuid
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from memory.sqlite.base import SQLiteBase, from_ts, to_ts
from memory.types import DocumentRecord, Passage, SourceRecord, source_key

_SOURCE_COLS = "agent_id, name, created_at, attach_all"


def _source(row: Sequence[Any]) -> SourceRecord:
    return SourceRecord(id=row[0], name=row[1], created_at=from_ts(row[2]), attach_all=bool(row[3]))


class SQLiteSources(SQLiteBase):
    @abstractmethod
    def _insert_passages(self, agent_id: str, passages: list[Passage]) -> list[int]:
        """Store passages in one write transaction, on the worker thread (archival storage)."""

    # -- shared collections ------------------------------------------------
    async def create_source(self, name: str) -> tuple[SourceRecord, bool]:
        return await self._call(self._create_source, name)

    def _create_source(self, name: str) -> tuple[SourceRecord, bool]:
        now, key = time.time(), source_key(name)
        with self._write() as conn:
            conn.execute(
                "INSERT INTO agents (id, key, created_at) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (uuid.uuid4().hex, key, now),
            )
            (agent_id,) = conn.execute("SELECT id FROM agents WHERE key = ?", (key,)).fetchone()
            created = conn.execute(
                "INSERT INTO sources (agent_id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (agent_id, name, now),
            ).rowcount
            row = conn.execute(f"SELECT {_SOURCE_COLS} FROM sources WHERE agent_id = ?", (agent_id,)).fetchone()
        return _source(row), bool(created)

    async def find_source(self, name: str) -> SourceRecord | None:
        rows = await self._rows(f"SELECT {_SOURCE_COLS} FROM sources WHERE name = ?", name)
        return _source(rows[0]) if rows else None

    async def list_sources(self) -> list[SourceRecord]:
        return [_source(row) for row in await self._rows(f"SELECT {_SOURCE_COLS} FROM sources ORDER BY name")]

    async def attach_source(self, source_id: str, agent_id: str | None) -> None:
        await self._call(self._set_attachment, source_id, agent_id, True)

    async def detach_source(self, source_id: str, agent_id: str | None) -> None:
        await self._call(self._set_attachment, source_id, agent_id, False)

    def _set_attachment(self, source_id: str, agent_id: str | None, attached: bool) -> None:
        with self._write() as conn:
            if agent_id is None:
                conn.execute("UPDATE sources SET attach_all = ? WHERE agent_id = ?", (int(attached), source_id))
                # Attaching to all clears earlier detaches; detaching from all clears everything.
                cleared = "attached = 0" if attached else "1"
                conn.execute(f"DELETE FROM source_attachments WHERE source_id = ? AND {cleared}", (source_id,))
            else:
                conn.execute(
                    "INSERT INTO source_attachments (agent_id, source_id, attached) VALUES (?, ?, ?)"
                    " ON CONFLICT (agent_id, source_id) DO UPDATE SET attached = excluded.attached",
                    (agent_id, source_id, int(attached)),
                )

    async def attached_sources(self, agent_id: str) -> list[SourceRecord]:
        cols = ", ".join(f"s.{col}" for col in _SOURCE_COLS.split(", "))
        sql = (
            f"SELECT {cols} FROM sources s LEFT JOIN source_attachments a"
            " ON a.source_id = s.agent_id AND a.agent_id = ?"
            " WHERE s.agent_id != ? AND (a.attached = 1 OR (s.attach_all = 1 AND a.attached IS NULL))"
            " ORDER BY s.name"
        )
        return [_source(row) for row in await self._rows(sql, agent_id, agent_id)]

    async def source_attachments(self, source_id: str) -> list[str]:
        sql = "SELECT agent_id FROM source_attachments WHERE source_id = ? AND attached = 1 ORDER BY agent_id"
        return [row[0] for row in await self._rows(sql, source_id)]

    # -- loaded documents ----------------------------------------------------
    async def record_document(self, agent_id: str, document: DocumentRecord) -> None:
        await self._call(self._record_document, agent_id, document)

    def _record_document(self, agent_id: str, document: DocumentRecord) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO documents (agent_id, sha256, name, passages, loaded_at) VALUES (?, ?, ?, ?, ?)",
                (agent_id, document.sha256, document.name, document.passages, to_ts(document.loaded_at)),
            )

    async def list_documents(self, agent_id: str) -> list[DocumentRecord]:
        sql = "SELECT sha256, name, passages, loaded_at FROM documents WHERE agent_id = ? ORDER BY loaded_at, name"
        return [DocumentRecord(row[0], row[1], row[2], from_ts(row[3])) for row in await self._rows(sql, agent_id)]

    async def known_passage_hashes(self, agent_id: str, hashes: Sequence[str]) -> set[str]:
        if not hashes:
            return set()
        return await self._call(self._known_hashes, agent_id, list(hashes))

    def _known_hashes(self, agent_id: str, hashes: list[str]) -> set[str]:
        rows = self._db.execute(
            "SELECT hash FROM passage_hashes WHERE agent_id = ? AND hash IN (SELECT value FROM json_each(?))",
            (agent_id, json.dumps(hashes)),
        )
        return {row[0] for row in rows}

    async def insert_hashed_passages(
        self, agent_id: str, passages: Sequence[Passage], hashes: Sequence[str]
    ) -> list[int]:
        if len(passages) != len(hashes):
            raise ValueError(f"{len(passages)} passages but {len(hashes)} hashes")
        if not passages:
            return []
        ids = await self._call(self._insert_hashed, agent_id, list(passages), list(hashes))
        for passage, new_id in zip(passages, ids, strict=True):
            if new_id:
                passage.id = new_id
        return ids

    def _insert_hashed(self, agent_id: str, passages: list[Passage], hashes: list[str]) -> list[int]:
        # One job on the store thread: no other call (another load of the same
        # agent in this process) can slip between the check and the insert, and
        # a cancelled caller cannot stop it between passages and their hashes.
        seen = self._known_hashes(agent_id, hashes)
        keep: list[int] = []
        for n, content_hash in enumerate(hashes):
            if content_hash not in seen:
                seen.add(content_hash)
                keep.append(n)
        ids = [0] * len(passages)
        if not keep:
            return ids
        new_ids = self._insert_passages(agent_id, [passages[n] for n in keep])
        with self._write() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO passage_hashes (agent_id, hash, passage_id) VALUES (?, ?, ?)",
                [(agent_id, hashes[n], new_id) for n, new_id in zip(keep, new_ids, strict=True)],
            )
        for n, new_id in zip(keep, new_ids, strict=True):
            ids[n] = new_id
        return ids
