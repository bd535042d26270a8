"""MongoStore's shared collections ("sources") and loaded-document records:
the SourceStore and DocumentStore roles (memory/roles.py), as a mixin of
MongoStore.

    sources             {_id: the source's agent id, name, attach_all, created_at}
    source_attachments  {agent_id, source_id, attached}   attached=False: a detach
                                                            that overrides attach_all
    documents           {agent_id, sha256, name, passages, loaded_at}

A passage's content hash is a field of the passage document itself, so it goes
when the passage goes, and a known hash always means a stored passage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

from pymongo import ASCENDING, IndexModel
from pymongo.errors import DuplicateKeyError

from memory.mongo.archival import MongoArchival
from memory.mongo.base import Doc, from_us, to_us
from memory.mongo.capabilities import guarded
from memory.store import DocumentRecord, SourceRecord, StoreError, source_key
from memory.types import Passage

SOURCE_INDEXES: dict[str, list[IndexModel]] = {
    "sources": [IndexModel([("name", ASCENDING)], unique=True, name="name_unique")],
    "source_attachments": [
        IndexModel([("agent_id", ASCENDING), ("source_id", ASCENDING)], unique=True, name="agent_source_unique"),
        IndexModel([("source_id", ASCENDING), ("agent_id", ASCENDING)], name="source_agent"),
    ],
    "documents": [
        IndexModel([("agent_id", ASCENDING), ("sha256", ASCENDING)], unique=True, name="agent_sha256_unique"),
        IndexModel([("agent_id", ASCENDING), ("loaded_at", ASCENDING)], name="agent_loaded"),
    ],
}


def _source(doc: Doc) -> SourceRecord:
    return SourceRecord(doc["_id"], doc["name"], from_us(doc["created_at"]), bool(doc.get("attach_all")))


class MongoSources(MongoArchival):
    async def _purge_sources(self, agent_id: str) -> None:
        """delete_agent's share: the agent as a collection, as an attachee, its documents."""
        await self._c("source_attachments").delete_many({"$or": [{"agent_id": agent_id}, {"source_id": agent_id}]})
        await self._c("sources").delete_one({"_id": agent_id})
        await self._c("documents").delete_many({"agent_id": agent_id})

    # -- shared collections ------------------------------------------------
    @guarded
    async def create_source(self, name: str) -> tuple[SourceRecord, bool]:
        # The collection's agent record has no blocks: it is born ready.
        agent_id = (await self._agent_doc(source_key(name), ready=True))["_id"]
        now = to_us(datetime.now(UTC))
        created = True
        try:
            await self._c("sources").insert_one({"_id": agent_id, "name": name, "attach_all": False, "created_at": now})
        except DuplicateKeyError:
            created = False
        doc = await self._c("sources").find_one({"_id": agent_id})
        if doc is None:  # deleted between the two calls
            raise StoreError(f"MongoDB store: collection {name!r} was deleted while being created")
        return _source(doc), created

    @guarded
    async def find_source(self, name: str) -> SourceRecord | None:
        doc = await self._c("sources").find_one({"name": name})
        return None if doc is None else _source(doc)

    @guarded
    async def list_sources(self) -> list[SourceRecord]:
        return [_source(doc) async for doc in self._c("sources").find({}).sort("name", ASCENDING)]

    @guarded
    async def attach_source(self, source_id: str, agent_id: str | None) -> None:
        await self._set_attachment(source_id, agent_id, True)

    @guarded
    async def detach_source(self, source_id: str, agent_id: str | None) -> None:
        await self._set_attachment(source_id, agent_id, False)

    async def _set_attachment(self, source_id: str, agent_id: str | None, attached: bool) -> None:
        attachments = self._c("source_attachments")
        if agent_id is None:
            await self._c("sources").update_one({"_id": source_id}, {"$set": {"attach_all": attached}})
            # Attaching to all clears earlier detaches; detaching from all clears everything.
            cleared: Doc = {"source_id": source_id, **({"attached": False} if attached else {})}
            await attachments.delete_many(cleared)
            return
        where = {"agent_id": agent_id, "source_id": source_id}
        try:
            await attachments.update_one(where, {"$set": {"attached": attached}}, upsert=True)
        except DuplicateKeyError:  # a concurrent upsert inserted it first
            await attachments.update_one(where, {"$set": {"attached": attached}})

    @guarded
    async def attached_sources(self, agent_id: str) -> list[SourceRecord]:
        cursor = self._c("source_attachments").find({"agent_id": agent_id})
        own = {doc["source_id"]: doc["attached"] async for doc in cursor}
        wanted = [source_id for source_id, attached in own.items() if attached]
        sources = self._c("sources").find({"$or": [{"attach_all": True}, {"_id": {"$in": wanted}}]})
        found = [
            _source(doc)
            async for doc in sources
            if doc["_id"] != agent_id and own.get(doc["_id"], bool(doc.get("attach_all")))
        ]
        return sorted(found, key=lambda source: source.name)

    @guarded
    async def source_attachments(self, source_id: str) -> list[str]:
        cursor = self._c("source_attachments").find({"source_id": source_id, "attached": True}, {"agent_id": 1})
        return [doc["agent_id"] async for doc in cursor.sort("agent_id", ASCENDING)]

    # -- loaded documents --------------------------------------------------
    @guarded
    async def record_document(self, agent_id: str, document: DocumentRecord) -> None:
        where = {"agent_id": agent_id, "sha256": document.sha256}
        doc = {**where, "name": document.name, "passages": document.passages, "loaded_at": to_us(document.loaded_at)}
        try:
            await self._c("documents").replace_one(where, doc, upsert=True)
        except DuplicateKeyError:
            await self._c("documents").replace_one(where, doc)

    @guarded
    async def list_documents(self, agent_id: str) -> list[DocumentRecord]:
        cursor = self._c("documents").find({"agent_id": agent_id}).sort([("loaded_at", ASCENDING), ("name", ASCENDING)])
        return [DocumentRecord(d["sha256"], d["name"], d["passages"], from_us(d["loaded_at"])) async for d in cursor]

    @guarded
    async def known_passage_hashes(self, agent_id: str, hashes: Sequence[str]) -> set[str]:
        if not hashes:
            return set()
        cursor = self._c("passages").find({"agent_id": agent_id, "hash": {"$in": list(hashes)}}, {"hash": 1})
        return {doc["hash"] async for doc in cursor}

    @guarded
    async def insert_hashed_passages(
        self, agent_id: str, passages: Sequence[Passage], hashes: Sequence[str]
    ) -> list[int]:
        if len(passages) != len(hashes):
            raise ValueError(f"{len(passages)} passages but {len(hashes)} hashes")
        if not passages:
            return []
        # The check and the insert are not atomic on the server: one lock per
        # agent keeps this process's own loads apart; two processes loading the
        # same file for the same agent at once could store a passage twice.
        lock = self._hash_locks.setdefault(agent_id, asyncio.Lock())
        async with lock:
            seen = await self.known_passage_hashes(agent_id, hashes)
            keep: list[int] = []
            for n, content_hash in enumerate(hashes):
                if content_hash not in seen:
                    seen.add(content_hash)
                    keep.append(n)
            ids = [0] * len(passages)
            if keep:
                new_ids = await self._insert_passages(agent_id, [passages[n] for n in keep], [hashes[n] for n in keep])
                for n, new_id in zip(keep, new_ids, strict=True):
                    ids[n] = new_id
        return ids
