"""Recall's in-process indexes and selective forget for the MongoDB store: one person's chosen messages go,
their documents whole (content, folded terms and embedding live in the one
document), and the in-process ranking index is rebuilt from what is left."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from memory.mongo.base import MongoBase
from memory.mongo.capabilities import guarded
from memory.mongo.recall import MessageIndexes


class MongoForgetting(MongoBase):
    @functools.cached_property
    def _conversations(self) -> MessageIndexes:
        """The per-agent conversation-search indexes (memory/mongo/recall.py)."""
        return MessageIndexes(int(self._indexes.maxsize))

    @guarded
    async def delete_messages(self, agent_id: str, seqs: Sequence[int]) -> int:
        if not seqs:
            return 0
        wanted = sorted({int(seq) for seq in seqs})
        result = await self._c("messages").delete_many({"agent_id": agent_id, "seq": {"$in": wanted}})
        # The cached index only ever appends: read again on the next search.
        self._conversations.forget(agent_id)
        return int(result.deleted_count)
