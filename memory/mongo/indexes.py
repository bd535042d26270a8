"""Every index the MongoDB store creates at open(), by collection: those of
memory (agents, working context, recall) here, and each part's own, declared
beside the code whose queries need them."""

from __future__ import annotations

from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

from memory.mongo.archival import ARCHIVAL_INDEXES
from memory.mongo.base import Doc
from memory.mongo.channels import CHANNEL_INDEXES
from memory.mongo.conversations import CONVERSATION_INDEXES
from memory.mongo.coordination import COORDINATION_INDEXES
from memory.mongo.inbox import INBOX_INDEXES
from memory.mongo.schedules import SCHEDULE_INDEXES
from memory.mongo.sources import SOURCE_INDEXES
from memory.mongo.usage import USAGE_INDEXES
from memory.mongo.vectors import VECTOR_INDEXES

INDEXES: dict[str, list[IndexModel]] = {
    "agents": [
        IndexModel([("key", ASCENDING)], unique=True, name="key_unique"),
        IndexModel([("created_at", ASCENDING)], name="created_at"),
        IndexModel([("deleting", ASCENDING)], name="deleting"),
    ],
    "blocks": [
        IndexModel([("agent_id", ASCENDING), ("label", ASCENDING)], unique=True, name="agent_label_unique"),
        IndexModel([("agent_id", ASCENDING), ("position", ASCENDING)], name="agent_position"),
    ],
    "messages": [
        IndexModel([("agent_id", ASCENDING), ("seq", ASCENDING)], unique=True, name="agent_seq_unique"),
        IndexModel([("agent_id", ASCENDING), ("created_at", ASCENDING), ("seq", ASCENDING)], name="agent_created"),
        IndexModel([("agent_id", ASCENDING), ("terms", ASCENDING)], name="agent_terms"),
        # A place's queue, and counts filtered by place.
        IndexModel([("agent_id", ASCENDING), ("place", ASCENDING), ("seq", ASCENDING)], name="agent_place_seq"),
    ],
}

# Every index the store creates at open(), by collection.
ALL_INDEXES: dict[str, list[IndexModel]] = {}
for _part in (
    INDEXES,
    ARCHIVAL_INDEXES,
    CONVERSATION_INDEXES,
    CHANNEL_INDEXES,
    SOURCE_INDEXES,
    COORDINATION_INDEXES,
    SCHEDULE_INDEXES,
    INBOX_INDEXES,
    USAGE_INDEXES,
    VECTOR_INDEXES,
):
    for _collection, _indexes in _part.items():
        ALL_INDEXES.setdefault(_collection, []).extend(_indexes)


async def ensure_indexes(db: AsyncDatabase[Doc]) -> None:
    """Create the missing indexes, one per call: FerretDB 1.24 drops the
    connection on a createIndexes of several indexes that already exist."""
    for name, models in ALL_INDEXES.items():
        present = set(await db[name].index_information())
        for model in models:
            if model.document["name"] not in present:
                await db[name].create_indexes([model])
