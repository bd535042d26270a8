"""MongoStore's archival storage: passages, their embeddings, and search by
meaning (the design is told in memory/mongo/store.py).

    passages  {_id: int id, agent_id, text, source, position, created_at, place,
               embedding (float list or null), embedded, [hash], terms, words}
    counters  {_id: "passage_id", value}: the next ids, reserved with $inc
              {_id: "vectors:<agent id>", value}: bumped on every change of
              the agent's vectors, so each process knows when its in-process
              VectorIndex of that agent is stale and rebuilds it.

Search is hybrid, as in the SQLite store: cosine plus a keyword bonus
(memory.search.hybrid), the keyword side from BM25 over the passages' stored `terms`
(memory/mongo/keywords.py). The cosine comes from `$vectorSearch` (exact) when
a ready Atlas vector index is named, otherwise from the in-process VectorIndex.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
from pymongo import ASCENDING, IndexModel, ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError

from memory.mongo.base import MAX_ATTEMPTS, Doc, MongoBase, Session, from_us, lost_race, to_us, visible_filter
from memory.mongo.capabilities import VECTOR_SEARCH, guarded
from memory.mongo.keywords import keyword_scores, passage_terms
from memory.places import DM_KEY, Visibility
from memory.search.hybrid import KEYWORD_WEIGHT, fuse
from memory.search.vector_index import VectorIndex, embedding_matrix
from memory.store import StoreError
from memory.types import Passage, SearchPage

_F32 = np.dtype("<f4")
# The keyword fields are only for search: never sent back with a passage.
_NO_TERMS: Doc = {"terms": 0, "words": 0, "analysed": 0}

ARCHIVAL_INDEXES: dict[str, list[IndexModel]] = {
    "passages": [
        IndexModel([("agent_id", ASCENDING), ("_id", ASCENDING)], name="agent_id"),
        IndexModel([("agent_id", ASCENDING), ("created_at", ASCENDING), ("_id", ASCENDING)], name="agent_created"),
        IndexModel([("agent_id", ASCENDING), ("embedded", ASCENDING), ("_id", ASCENDING)], name="agent_embedded"),
        IndexModel([("agent_id", ASCENDING), ("hash", ASCENDING)], name="agent_hash"),
        IndexModel([("agent_id", ASCENDING), ("terms", ASCENDING)], name="agent_terms"),
        # Searches, lists and counts limited to some places.
        IndexModel([("agent_id", ASCENDING), ("place", ASCENDING), ("_id", ASCENDING)], name="agent_place"),
    ],
}


def _passage(doc: Doc) -> Passage:
    return Passage(
        id=doc["_id"],
        text=doc["text"],
        source=doc.get("source"),
        position=doc.get("position"),
        created_at=from_us(doc["created_at"]),
        embedding=doc.get("embedding"),
        place=doc.get("place", DM_KEY),
    )


class MongoArchival(MongoBase):
    @guarded
    async def insert_passages(self, agent_id: str, passages: Sequence[Passage]) -> list[int]:
        return await self._insert_passages(agent_id, passages)

    async def _insert_passages(
        self, agent_id: str, passages: Sequence[Passage], hashes: Sequence[str] | None = None
    ) -> list[int]:
        """Store passages (with their content hashes, if given: they live on
        the passage, so deleting it forgets the hash) and return their ids."""
        if not passages:
            return []
        embedded = [n for n, p in enumerate(passages) if p.embedding is not None]
        matrix = await self._checked_vectors(agent_id, [passages[n].embedding or [] for n in embedded])
        vectors = {n: matrix[i].tolist() for i, n in enumerate(embedded)}
        docs = [
            {
                "agent_id": agent_id,
                "text": p.text,
                "source": p.source,
                "position": p.position,
                "created_at": to_us(p.created_at),
                "place": p.place,
                "embedding": vectors.get(n),
                "embedded": n in vectors,
                **passage_terms(p.text),
            }
            for n, p in enumerate(passages)
        ]
        for doc, content_hash in zip(docs, hashes or (), strict=False):
            doc["hash"] = content_hash
        await self._require_agent(agent_id)
        ids = await self._insert_passage_docs(docs)
        for passage, new_id in zip(passages, ids, strict=True):
            passage.id = new_id
        if embedded:
            await self._vectors_changed(agent_id, lambda index: index.add([ids[n] for n in embedded], matrix))
        return ids

    async def _insert_passage_docs(self, docs: list[Doc]) -> list[int]:
        """Ids come from a counter reserved with $inc. On servers where $inc is
        not atomic (FerretDB) two writers may get the same ids: the unique _id
        settles it, the loser takes back what it inserted and tries again."""
        counters, passages = self._c("counters"), self._c("passages")
        for attempt in range(MAX_ATTEMPTS):
            async with self._id_lock:  # no race between this process's own reservations
                counter = await counters.find_one_and_update(
                    {"_id": "passage_id"},
                    {"$inc": {"value": len(docs)}},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            if counter is None:  # cannot be, with upsert and AFTER
                raise StoreError("MongoDB store: the passage id counter vanished")
            first = counter["value"] - len(docs) + 1
            batch = [{**doc, "_id": first + n} for n, doc in enumerate(docs)]

            async def insert(session: Session, batch: list[Doc] = batch) -> None:
                await passages.insert_many(batch, ordered=True, session=session)

            try:
                # In a transaction where possible, so the batch is all or nothing.
                await self._atomic(insert)
                return [doc["_id"] for doc in batch]
            except BulkWriteError as exc:
                if not lost_race(exc):
                    raise
                done = exc.details.get("nInserted", 0)
                if done and not (self.capabilities and self.capabilities.transactions):
                    await passages.delete_many({"_id": {"$in": [doc["_id"] for doc in batch[:done]]}})
            except DuplicateKeyError:
                pass
            await self._backoff(attempt)
        raise StoreError(f"MongoDB store: gave up inserting passages after {MAX_ATTEMPTS} id races")

    @guarded
    async def set_embeddings(self, agent_id: str, vectors: dict[int, list[float]]) -> None:
        if not vectors:
            return
        ids = [int(i) for i in vectors]
        matrix = await self._checked_vectors(agent_id, [vectors[i] for i in vectors])
        passages = self._c("passages")
        # Only the agent's own passages (looked up by agent_id) are written.
        owned = {doc["_id"] async for doc in passages.find({"agent_id": agent_id, "_id": {"$in": ids}}, {"_id": 1})}
        rows = [n for n, passage_id in enumerate(ids) if passage_id in owned]
        if not rows:
            return
        updates = [(ids[n], {"embedding": matrix[n].tolist(), "embedded": True}) for n in rows]
        await self._update_by_id(passages, updates)
        await self._vectors_changed(agent_id, lambda index: index.add([ids[n] for n in rows], matrix[rows]))

    async def _checked_vectors(self, agent_id: str, vectors: list[list[float]]) -> npt.NDArray[np.float32]:
        """Vectors as a float32 matrix, refused (ValueError) before anything is
        written if their length differs from the agent's stored embeddings."""
        if not vectors:
            return embedding_matrix(vectors)
        cached = self._indexes.get(agent_id)
        dim = cached[0].dim if cached is not None else None
        if dim is None:
            doc = await self._c("passages").find_one({"agent_id": agent_id, "embedded": True}, {"embedding": 1})
            dim = None if doc is None else len(doc["embedding"])
        return embedding_matrix(vectors, dim)

    async def _vectors_changed(self, agent_id: str, apply: Callable[[VectorIndex], None]) -> None:
        """Bump the agent's vector version (other processes then rebuild their
        copy) and bring ours along if no one else changed it meanwhile."""
        doc = await self._c("counters").find_one_and_update(
            {"_id": f"vectors:{agent_id}"}, {"$inc": {"value": 1}}, upsert=True, return_document=ReturnDocument.AFTER
        )
        cached = self._indexes.get(agent_id)
        if cached is None:
            return
        if doc is None:  # cannot be, with upsert and AFTER
            del self._indexes[agent_id]
            return
        index, version = cached
        if doc["value"] == version + 1:
            apply(index)
            self._indexes[agent_id] = (index, doc["value"])
        else:
            del self._indexes[agent_id]

    @guarded
    async def passages_without_embedding(self, agent_id: str) -> list[Passage]:
        cursor = self._c("passages").find({"agent_id": agent_id, "embedded": False}, _NO_TERMS).sort("_id", ASCENDING)
        return [_passage(doc) async for doc in cursor]

    @guarded
    async def search_passages(
        self,
        agent_id: str,
        query_text: str,
        query_vector: Sequence[float],
        limit: int,
        offset: int = 0,
        *,
        visible: Visibility | None = None,
    ) -> SearchPage:
        offset = max(offset, 0)
        where = visible_filter(visible)
        # A search limited to some places is ranked in process: the Atlas
        # index would need `place` declared as a filter field.
        if not where and self.capabilities is not None and self.capabilities.archival_search == VECTOR_SEARCH:
            return await self._vector_search(agent_id, query_text, query_vector, limit, offset)
        index = await self._index(agent_id)
        if where:
            return await self._search_visible(agent_id, query_text, query_vector, limit, offset, where, index)
        if not len(index) or limit <= 0:
            return SearchPage(items=[], total=len(index))
        keyword = await keyword_scores(self._c("passages"), agent_id, query_text)
        # The bonus goes into the exact ranking of the whole archive, as in
        # sqlite_search; ids without a vector are ignored by the index.
        bonus = {pid: KEYWORD_WEIGHT * share for pid, share in keyword.items()}
        hits = index.search(np.asarray(query_vector, dtype=_F32), offset + limit, boost=bonus)[offset:]
        return SearchPage(items=await self._passages_for(agent_id, hits), total=len(index))

    async def _search_visible(
        self,
        agent_id: str,
        text: str,
        query: Sequence[float],
        limit: int,
        offset: int,
        where: Doc,
        index: VectorIndex,
    ) -> SearchPage:
        """Exact hybrid ranking of only the embedded passages `where` (a place
        filter) selects: filtered before ranking and paging."""
        cursor = self._c("passages").find({"agent_id": agent_id, "embedded": True, **where}, {"_id": 1})
        allowed = [doc["_id"] async for doc in cursor]
        if not allowed or limit <= 0:
            return SearchPage(items=[], total=len(allowed))
        keyword = await keyword_scores(self._c("passages"), agent_id, text, where)
        ranked = fuse(index.similarity(np.asarray(query, dtype=_F32), allowed), keyword)
        hits = ranked[offset : offset + limit]
        return SearchPage(items=await self._passages_for(agent_id, hits), total=len(ranked))

    async def _passages_for(self, agent_id: str, hits: list[tuple[int, float]]) -> list[tuple[Passage, float]]:
        """The hits' passages, in the hits' order (one gone meanwhile is skipped)."""
        if not hits:
            return []
        cursor = self._c("passages").find({"agent_id": agent_id, "_id": {"$in": [pid for pid, _ in hits]}}, _NO_TERMS)
        by_id = {doc["_id"]: doc async for doc in cursor}
        return [(_passage(by_id[pid]), score) for pid, score in hits if pid in by_id]

    async def _index(self, agent_id: str) -> VectorIndex:
        """The agent's vector index; rebuilt from the stored vectors when
        another process (or a crash-free restart) changed them since."""
        doc = await self._c("counters").find_one({"_id": f"vectors:{agent_id}"})
        version = 0 if doc is None else int(doc["value"])
        cached = self._indexes.get(agent_id)
        if cached is not None and cached[1] == version:
            return cached[0]
        cursor = self._c("passages").find({"agent_id": agent_id, "embedded": True}, {"embedding": 1})
        rows = [(doc["_id"], doc["embedding"]) async for doc in cursor]
        index = VectorIndex(capacity=max(64, len(rows)))
        if rows:
            if len({len(vector) for _, vector in rows}) != 1:
                raise StoreError(f"MongoDB store: agent {agent_id} has embeddings of mixed lengths")
            index.add([pid for pid, _ in rows], np.asarray([vector for _, vector in rows], dtype=_F32))
        self._indexes[agent_id] = (index, version)
        return index

    async def _vector_search(
        self, agent_id: str, text: str, query: Sequence[float], limit: int, offset: int
    ) -> SearchPage:
        """Atlas $vectorSearch, exact (ENN) so results match the in-process path.
        Its cosine score is (1 + cos) / 2; we use cos, like VectorIndex. The
        nearest offset + limit by cosine plus every keyword hit hold the exact
        top offset + limit of the hybrid score: a passage without a bonus
        ranks by its cosine, so it cannot beat the nearest ones by cosine."""
        passages = self._c("passages")
        total = await passages.count_documents({"agent_id": agent_id, "embedded": True})
        if limit <= 0 or offset >= total:
            return SearchPage(items=[], total=total)
        stage = {
            "index": self._vector_index,
            "path": "embedding",
            "queryVector": [float(x) for x in query],
            "filter": {"agent_id": agent_id},
            "exact": True,
            "limit": offset + limit,
        }
        cursor = await passages.aggregate(
            [{"$vectorSearch": stage}, {"$project": {"_score": {"$meta": "vectorSearchScore"}}}]
        )
        near = {doc["_id"]: 2.0 * float(doc["_score"]) - 1.0 async for doc in cursor}
        keyword = await keyword_scores(passages, agent_id, text)
        missing = [pid for pid in keyword if pid not in near]
        if missing:
            unit = np.asarray(query, dtype=_F32)
            unit /= max(float(np.linalg.norm(unit)), 1e-12)
            found = passages.find({"agent_id": agent_id, "_id": {"$in": missing}, "embedded": True}, {"embedding": 1})
            async for doc in found:
                vector = np.asarray(doc["embedding"], dtype=_F32)
                near[doc["_id"]] = float(vector @ unit) / max(float(np.linalg.norm(vector)), 1e-12)
        hits = fuse(near, keyword)[offset : offset + limit]
        return SearchPage(items=await self._passages_for(agent_id, hits), total=total)

    @guarded
    async def list_passages(
        self, agent_id: str, limit: int, offset: int = 0, *, visible: Visibility | None = None
    ) -> list[Passage]:
        if limit <= 0:
            return []
        cursor = self._c("passages").find({"agent_id": agent_id, **visible_filter(visible)}, _NO_TERMS)
        cursor = cursor.sort([("created_at", ASCENDING), ("_id", ASCENDING)])
        return [_passage(doc) async for doc in cursor.skip(max(offset, 0)).limit(limit)]

    @guarded
    async def count_passages(self, agent_id: str, *, visible: Visibility | None = None) -> int:
        return await self._c("passages").count_documents({"agent_id": agent_id, **visible_filter(visible)})

    @guarded
    async def delete_passages(self, agent_id: str, ids: Sequence[int]) -> None:
        if not ids:
            return
        gone = [int(i) for i in ids]
        await self._c("passages").delete_many({"agent_id": agent_id, "_id": {"$in": gone}})
        await self._vectors_changed(agent_id, lambda index: index.remove(gone))
