"""Working-context blocks as MongoDB documents: {agent_id, label, lines,
limit, updated_at, position}, `lines` each {id, text, place, written_at,
shared} (memory/types.py BlockLine), and the upgrade of blocks stored before
lines had places."""

from __future__ import annotations

import logging

from pymongo.asynchronous.database import AsyncDatabase

from memory.mongo.base import Doc, from_us, to_us
from memory.places import DM_KEY
from memory.types import Block, BlockLine
from memory.working_context import lines_from_before_places

log = logging.getLogger("memory.mongo.store")


def block_fields(block: Block) -> Doc:
    """A block document's fields but its agent, label and position."""
    lines = [line.record() for line in block.lines]
    return {"lines": lines, "limit": block.limit, "updated_at": to_us(block.updated_at)}


def block_from_doc(doc: Doc) -> Block:
    lines = [BlockLine.from_record(record) for record in doc.get("lines", [])]
    return Block(doc["label"], limit=doc["limit"], updated_at=from_us(doc["updated_at"]), lines=lines)


async def upgrade_block_lines(db: AsyncDatabase[Doc]) -> None:
    """Blocks with a `value` (written before lines had places) get their lines,
    written in the DM, the safe side (memory/working_context.py); idempotent,
    at open: one update per block, `value` removed in the same write."""
    written: dict[str, int] = {}
    async for doc in db["blocks"].find({"value": {"$exists": True}}):
        lines = lines_from_before_places(doc["value"], from_us(doc["updated_at"]))
        await db["blocks"].update_one(
            {"_id": doc["_id"]}, {"$set": {"lines": [line.record() for line in lines]}, "$unset": {"value": ""}}
        )
        written[doc["agent_id"]] = written.get(doc["agent_id"], 0) + sum(line.place == DM_KEY for line in lines)
    for agent_id, count in written.items():
        owner = await db["agents"].find_one({"_id": agent_id}, {"key": 1})
        if count and owner is not None:
            log.info(
                "agent %s: %d working-context lines from before places count as written in the DM",
                owner.get("key", agent_id),
                count,
            )
