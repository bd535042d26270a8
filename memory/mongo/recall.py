"""Recall search for the MongoDB store: conversation search ranking
(memory/search/conversation.py) over the agent's messages, as the SQLite store
does (memory/sqlite/recall.py), so both rank alike.

Each agent's messages are held in an LRU-bounded cache of
ConversationIndexes, read on its first search and brought up to date on every
search: messages with a higher seq (one indexed query on agent_id + seq, empty
when nothing is new) with their vectors (message_vectors, memory/mongo/
vectors.py) and, for the newest turns the index has no vector for, the
vectors the database now holds (stored by another process, which worked
on the agent while this one held it cached).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cachetools import LRUCache
from pymongo import ASCENDING
from pymongo.asynchronous.collection import AsyncCollection

from memory.mongo.base import Doc, from_us
from memory.places import DM_KEY, Visibility
from memory.search.conversation import ConversationIndex, Ranked, Vector
from memory.types import Message

# Vectors of at most this many turns (the newest lacking one) are looked up per search.
REFRESH_LIMIT = 512
_INDEXED: Doc = {
    "_id": 0,
    "seq": 1,
    "role": 1,
    "content": 1,
    "tool_calls": 1,
    "name": 1,
    "created_at": 1,
    "place": 1,
    "speaker_name": 1,
}
_VECTOR: Doc = {"_id": 0, "seq": 1, "embedding": 1}


def _indexed(doc: Doc) -> Message:
    return Message(
        role=doc["role"],
        content=doc.get("content"),
        tool_calls=json.loads(doc["tool_calls"]) if doc.get("tool_calls") else None,
        name=doc.get("name"),
        created_at=from_us(doc["created_at"]),
        seq=doc["seq"],
        place=doc.get("place", DM_KEY),
        speaker_name=doc.get("speaker_name", ""),
    )


class MessageIndexes:
    """Per-agent ConversationIndexes of one MongoStore."""

    def __init__(self, max_cached: int = 256) -> None:
        self._cache: LRUCache[str, ConversationIndex] = LRUCache(max(max_cached, 1))

    @property
    def cached_agents(self) -> Mapping[str, ConversationIndex]:
        return self._cache

    async def index(
        self, messages: AsyncCollection[Any], vectors: AsyncCollection[Any], agent_id: str
    ) -> ConversationIndex:
        """The agent's index, brought up to date: `messages` and their `vectors`
        (memory/mongo/vectors.py) with a higher seq than it holds."""
        index = self._cache.get(agent_id)
        if index is None:
            index = self._cache[agent_id] = ConversationIndex()
        newer = {"agent_id": agent_id, "seq": {"$gt": index.last_seq}}
        docs = [doc async for doc in messages.find(newer, _INDEXED).sort("seq", ASCENDING)]
        if docs:
            seqs = {doc["seq"] for doc in docs}  # not a vector of a message that came after this read
            found = {doc["seq"]: doc["embedding"] async for doc in vectors.find(newer, _VECTOR) if doc["seq"] in seqs}
            index.add(map(_indexed, docs), found)
            return index
        missing = index.missing_vectors(REFRESH_LIMIT)
        if missing:
            where = {"agent_id": agent_id, "seq": {"$in": missing}}
            index.set_vectors({doc["seq"]: doc["embedding"] async for doc in vectors.find(where, _VECTOR)})
        return index

    async def rank(
        self,
        messages: AsyncCollection[Any],
        vectors: AsyncCollection[Any],
        agent_id: str,
        query: str,
        query_vector: Sequence[float] | None,
        limit: int,
        offset: int,
        visible: Visibility | None = None,
    ) -> Ranked:
        return (await self.index(messages, vectors, agent_id)).rank(query, query_vector, limit, offset, visible=visible)

    def added(self, agent_id: str, vectors: Mapping[int, Vector]) -> None:
        """Vectors this process stored (an uncached agent reads them later)."""
        index = self._cache.get(agent_id)
        if index is not None:
            index.set_vectors(vectors)

    def forget(self, agent_id: str) -> None:
        self._cache.pop(agent_id, None)
