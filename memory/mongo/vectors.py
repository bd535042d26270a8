"""Recall's message embeddings on MongoDB, kept apart from the messages:

    message_vectors  {_id: "<agent id>:<seq>", agent_id, seq, embedding}

and `embedded: true` on a message once its vector is stored.

Why apart: a query that the server cannot answer from an index reads every
document it filters. FerretDB does that for nearly every query (1.24 on
SQLite pushes down only a filter on `_id` alone; on PostgreSQL, equalities
on top-level scalars), and a 384-float embedding is twenty times the rest of
a message: measured on FerretDB 1.24 with 5,000 messages, a find by
(agent_id, event_id) took 11.9 s with the embeddings inside, 0.58 s without
(SQLite backend), and 151 ms against 6 ms (PostgreSQL backend, where the
embedding made each row a TOASTed value to decompress). On a real MongoDB
the indexes answer those queries either way, and smaller message documents
are still fewer pages read.

A vector's `_id` names its message (agent id and seq), so a vector is
written, replaced and deleted by `_id`, the one filter every server answers
from its primary key. Vectors are written before their messages are marked
`embedded`, and a vector whose message went meanwhile (deleted by another
call) is deleted again, so no vector outlives its message. Databases of
earlier versions, whose messages hold `embedding`, are moved over at open
(upgrade_message_vectors: vector first, then the message's field unset, so a
crash in between leaves a vector that the next open writes again).
"""

from __future__ import annotations

import functools
import logging
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence

from pymongo import ASCENDING, DESCENDING, IndexModel, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from memory.mongo.base import WRITE_BATCH, Doc, MongoBase
from memory.mongo.capabilities import guarded
from memory.mongo.recall import MessageIndexes
from memory.search.vector_index import check_dimension, embedding_matrix
from memory.types import Message

log = logging.getLogger(__name__)

VECTORS = "message_vectors"
VECTOR_INDEXES: dict[str, list[IndexModel]] = {
    VECTORS: [IndexModel([("agent_id", ASCENDING), ("seq", ASCENDING)], name="agent_seq")],
    "messages": [IndexModel([("agent_id", ASCENDING), ("embedded", ASCENDING)], name="agent_embedded")],
}
# Messages moved at a time when an older database is upgraded.
UPGRADE_BATCH = 200


def vector_id(agent_id: str, seq: int) -> str:
    return f"{agent_id}:{int(seq)}"


async def _write_vectors(vectors: AsyncCollection[Doc], agent_id: str, found: Mapping[int, list[float]]) -> None:
    """Upsert the vectors of the agent's messages (seq -> vector), by _id, WRITE_BATCH to a bulk write."""
    operations = [
        UpdateOne(
            {"_id": vector_id(agent_id, seq)},
            {"$set": {"agent_id": agent_id, "seq": int(seq), "embedding": vector}},
            upsert=True,
        )
        for seq, vector in found.items()
    ]
    for start in range(0, len(operations), WRITE_BATCH):
        await vectors.bulk_write(operations[start : start + WRITE_BATCH], ordered=False)


async def drop_vectors(vectors: AsyncCollection[Doc], agent_id: str, seqs: Iterable[int]) -> None:
    """Delete the vectors of these messages of the agent (theirs are going or went)."""
    ids = sorted({vector_id(agent_id, seq) for seq in seqs})
    for start in range(0, len(ids), 1000):
        await vectors.delete_many({"_id": {"$in": ids[start : start + 1000]}})


async def upgrade_message_vectors(db: AsyncDatabase[Doc]) -> None:
    """Move embeddings stored inside messages (before message_vectors) to
    their own documents (idempotent, at open; logs how many)."""
    messages = db["messages"]
    moved = 0
    fields = {"agent_id": 1, "seq": 1, "embedding": 1}
    while batch := [doc async for doc in messages.find({"embedding": {"$exists": True}}, fields).limit(UPGRADE_BATCH)]:
        by_agent: dict[str, dict[int, list[float]]] = {}
        for doc in batch:
            by_agent.setdefault(doc["agent_id"], {})[int(doc["seq"])] = doc["embedding"]
        for agent_id, found in by_agent.items():
            await _write_vectors(db[VECTORS], agent_id, found)
        marks = [
            UpdateOne({"_id": doc["_id"]}, {"$set": {"embedded": True}, "$unset": {"embedding": ""}}) for doc in batch
        ]
        for start in range(0, len(marks), WRITE_BATCH):
            await messages.bulk_write(marks[start : start + WRITE_BATCH], ordered=False)
        moved += len(batch)
    if moved:
        log.info("moved the embeddings of %d recall messages to %s", moved, VECTORS)


class MongoMessageVectors(MongoBase):
    """The MessageEmbeddingStore role (memory/roles.py) on MongoDB, and the
    per-agent conversation-search indexes the vectors feed."""

    @functools.cached_property
    def _conversations(self) -> MessageIndexes:
        """The per-agent conversation-search indexes (memory/mongo/recall.py)."""
        return MessageIndexes(int(self._indexes.maxsize))

    _message_fields: Doc

    @staticmethod
    @abstractmethod
    def _message_of(doc: Doc) -> Message: ...

    @guarded
    async def messages_without_embedding(self, agent_id: str, limit: int) -> list[Message]:
        if limit <= 0:
            return []
        # People's and the agent's own words; tool results and system alerts
        # (role user, name system_alert) are left to keyword search.
        where = {
            "agent_id": agent_id,
            "role": {"$in": ["user", "assistant"]},
            "content": {"$nin": [None, ""]},
            "name": {"$ne": "system_alert"},
            "embedded": {"$ne": True},
        }
        cursor = self._c("messages").find(where, self._message_fields).sort("seq", DESCENDING).limit(limit)
        return [self._message_of(doc) async for doc in cursor]

    @guarded
    async def set_message_embeddings(self, agent_id: str, vectors: Mapping[int, Sequence[float]]) -> None:
        if not vectors:
            return
        seqs = [int(seq) for seq in vectors]
        matrix = embedding_matrix([vectors[seq] for seq in vectors])
        stored = await self._c(VECTORS).find_one({"agent_id": agent_id}, {"embedding": 1})
        check_dimension(matrix, None if stored is None else len(stored["embedding"]))
        messages = self._c("messages")
        # Only the agent's own messages (looked up by agent_id) are written.
        where = {"agent_id": agent_id, "seq": {"$in": seqs}}
        ids = {doc["seq"]: doc["_id"] async for doc in messages.find(where, {"_id": 1, "seq": 1})}
        rows = {seq: matrix[n] for n, seq in enumerate(seqs) if seq in ids}
        await _write_vectors(self._c(VECTORS), agent_id, {seq: row.tolist() for seq, row in rows.items()})
        marks = [UpdateOne({"_id": ids[seq]}, {"$set": {"embedded": True}}) for seq in rows]
        matched = 0
        for start in range(0, len(marks), WRITE_BATCH):
            matched += (await messages.bulk_write(marks[start : start + WRITE_BATCH], ordered=False)).matched_count
        left = set(rows)
        if matched < len(marks):  # a message deleted since it was looked up takes its vector with it
            found = messages.find({"_id": {"$in": [ids[seq] for seq in rows]}}, {"seq": 1})
            left = {int(doc["seq"]) async for doc in found}
            await drop_vectors(self._c(VECTORS), agent_id, set(rows) - left)
        self._conversations.added(agent_id, {seq: row for seq, row in rows.items() if seq in left})
