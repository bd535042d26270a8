"""Recall's in-process indexes and selective forget for the MongoDB store: one person's chosen messages go,
their documents whole (content and folded terms live in the one document)
with their vectors (memory/mongo/vectors.py), and the in-process ranking
index is rebuilt from what is left."""

from __future__ import annotations

from collections.abc import Sequence

from memory.mongo.capabilities import guarded
from memory.mongo.vectors import VECTORS, MongoMessageVectors, drop_vectors


class MongoForgetting(MongoMessageVectors):
    @guarded
    async def delete_messages(self, agent_id: str, seqs: Sequence[int]) -> int:
        if not seqs:
            return 0
        wanted = sorted({int(seq) for seq in seqs})
        # Vectors first: a crash between the two leaves a message without its vector (a
        # forget done again deletes it), never a vector of a forgotten message.
        await drop_vectors(self._c(VECTORS), agent_id, wanted)
        result = await self._c("messages").delete_many({"agent_id": agent_id, "seq": {"$in": wanted}})
        # The cached index only ever appends: read again on the next search.
        self._conversations.forget(agent_id)
        return int(result.deleted_count)
