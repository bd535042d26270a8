"""MongoStore's conversations: each place's FIFO queue state (the AgentStore
calls about it), and the upgrade of a database written before places.

    conversations  {agent_id, place, name, summary, queue_start_seq,
                    summary_updated_at}   unique (agent_id, place)

A conversation is created by an insert against that unique index, the one
write every MongoDB-compatible server makes atomic: concurrent first uses of
a place settle on one document.
"""

from __future__ import annotations

import logging
from datetime import datetime

from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from memory.mongo.base import Doc, MongoBase, from_us, to_us
from memory.mongo.capabilities import guarded
from memory.places import DM_KEY
from memory.types import SOURCE_KEY_PREFIX, ConversationRecord

log = logging.getLogger("memory.mongo.store")

CONVERSATION_INDEXES: dict[str, list[IndexModel]] = {
    "conversations": [
        IndexModel([("agent_id", ASCENDING), ("place", ASCENDING)], unique=True, name="agent_place_unique"),
    ],
}
# The queue state agent documents held before places (now in the "dm" conversation).
_LEGACY_QUEUE_FIELDS = ("summary", "queue_start_seq", "summary_updated_at")


def _conversation(doc: Doc) -> ConversationRecord:
    summary_at = doc.get("summary_updated_at")
    return ConversationRecord(
        doc["agent_id"],
        doc["place"],
        doc.get("name", ""),
        doc.get("summary", ""),
        doc.get("queue_start_seq", 1),
        None if summary_at is None else from_us(summary_at),
    )


def _new_conversation(agent_id: str, place: str, name: str = "") -> Doc:
    return {
        "agent_id": agent_id,
        "place": place,
        "name": name,
        "summary": "",
        "queue_start_seq": 1,
        "summary_updated_at": None,
    }


class MongoConversations(MongoBase):
    @guarded
    async def get_conversation(self, agent_id: str, place: str, name: str = "") -> ConversationRecord:
        await self._require_agent(agent_id)
        conversations = self._c("conversations")
        where = {"agent_id": agent_id, "place": place}
        doc = await conversations.find_one(where)
        if doc is None:
            doc = _new_conversation(agent_id, place, name)
            try:
                await conversations.insert_one(doc)
                return _conversation(doc)
            except DuplicateKeyError:  # a concurrent first use won: read its document
                doc = await conversations.find_one(where) or doc
        if name and doc.get("name") != name:
            await conversations.update_one(where, {"$set": {"name": name}})
            doc["name"] = name
        return _conversation(doc)

    @guarded
    async def list_conversations(self, agent_id: str) -> list[ConversationRecord]:
        cursor = self._c("conversations").find({"agent_id": agent_id}).sort("place", ASCENDING)
        return [_conversation(doc) async for doc in cursor]

    @guarded
    async def update_queue(
        self,
        agent_id: str,
        summary: str,
        queue_start_seq: int,
        summary_updated_at: datetime,
        *,
        place: str = DM_KEY,
    ) -> None:
        await self._require_agent(agent_id)
        fields = {"summary": summary, "queue_start_seq": queue_start_seq}
        fields["summary_updated_at"] = to_us(summary_updated_at)
        conversations = self._c("conversations")
        where = {"agent_id": agent_id, "place": place}
        if (await conversations.update_one(where, {"$set": fields})).matched_count:
            return
        try:
            await conversations.insert_one({**_new_conversation(agent_id, place), **fields})
        except DuplicateKeyError:  # created meanwhile: one plain update is atomic enough
            await conversations.update_one(where, {"$set": fields})


async def upgrade_to_places(db: AsyncDatabase[Doc]) -> None:
    """Bring a database written before places up to date (idempotent, at open):
    messages and passages without a place count as "dm" (DM-only, the safe
    side), and each agent's queue state moves into its "dm" conversation."""
    missing = {"place": {"$exists": False}}
    counts: dict[str, list[int]] = {}
    for n, name in enumerate(("messages", "passages")):
        cursor = await db[name].aggregate([{"$match": missing}, {"$group": {"_id": "$agent_id", "n": {"$sum": 1}}}])
        async for row in cursor:
            counts.setdefault(row["_id"], [0, 0])[n] = int(row["n"])
        await db[name].update_many(missing, {"$set": {"place": DM_KEY}})
    legacy = {"$or": [{field: {"$exists": True}} for field in _LEGACY_QUEUE_FIELDS]}
    async for agent in db["agents"].find(legacy):
        if not str(agent.get("key", "")).startswith(SOURCE_KEY_PREFIX):
            doc = _new_conversation(agent["_id"], DM_KEY)
            doc.update({field: agent[field] for field in _LEGACY_QUEUE_FIELDS if field in agent})
            try:
                await db["conversations"].insert_one(doc)
            except DuplicateKeyError:
                pass  # moved by an earlier open that stopped before the $unset
        await db["agents"].update_one({"_id": agent["_id"]}, {"$unset": dict.fromkeys(_LEGACY_QUEUE_FIELDS, "")})
    for agent_id, (messages, passages) in counts.items():
        owner = await db["agents"].find_one({"_id": agent_id}, {"key": 1})
        if owner is not None and not str(owner.get("key", "")).startswith(SOURCE_KEY_PREFIX):
            log.info(
                "agent %s: %d messages and %d passages from before places count as DM-only",
                owner.get("key", agent_id),
                messages,
                passages,
            )
