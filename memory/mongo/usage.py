"""MongoStore's share of usage limits: the UsageStore role (memory/roles.py),
as a mixin of MongoStore.

    usage_hits    {_id: ObjectId, key, kind, at, amount}    index (key, kind, at), (at)
    usage_exempt  {_id: agent key, since}

Counters that must hold across processes are one inserted document per hit,
counted or summed over a window, never a `$inc` on one document: FerretDB
runs an update as a read, then a write, so concurrent increments lose hits,
while concurrent inserts all land. Documents older than the longest window
are swept by `prune_usage` (a TTL index would need a BSON date, and FerretDB
1.24 has no TTL indexes anyway). Times are integer microseconds since the
epoch (UTC), as everywhere in the MongoDB store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pymongo import ASCENDING, IndexModel
from pymongo.errors import DuplicateKeyError

from memory.mongo.base import MongoBase, from_us, to_us
from memory.mongo.capabilities import guarded
from memory.store import UsageTally

USAGE_INDEXES: dict[str, list[IndexModel]] = {
    "usage_hits": [
        IndexModel([("key", ASCENDING), ("kind", ASCENDING), ("at", ASCENDING)], name="key_kind_at"),
        IndexModel([("at", ASCENDING)], name="at"),
    ],
}


def _tally(hits: list[tuple[int, int]]) -> UsageTally:
    """A window's tally from its (at, amount) hits, oldest first."""
    if not hits:
        return UsageTally(0, 0, None, None)
    return UsageTally(len(hits), sum(amount for _, amount in hits), from_us(hits[0][0]), from_us(hits[-1][0]))


class MongoUsage(MongoBase):
    @guarded
    async def record_usage(self, key: str, hits: Mapping[str, int], at: datetime) -> None:
        documents = [
            {"key": key, "kind": kind, "at": to_us(at), "amount": int(amount)} for kind, amount in hits.items()
        ]
        if documents:
            await self._c("usage_hits").insert_many(documents)

    async def usage_since(self, key: str, kind: str, since: datetime) -> UsageTally:
        return (await self.usage_windows(key, [(kind, since)]))[0]

    @guarded
    async def usage_windows(self, key: str, windows: Sequence[tuple[str, datetime]]) -> list[UsageTally]:
        """Every window's hits are read together (one query) and counted here.

        Summed here, not by $group: FerretDB 1.24 computes only the first
        accumulator of a $group (the others come back 0) and has no $min or
        $max. A window holds few hits anyway: the limits themselves stop them
        (a minute of messages; a day of events, one token hit each)."""
        if not windows:
            return []
        starts = [(kind, to_us(since)) for kind, since in windows]
        either = [{"kind": kind, "at": {"$gte": start}} for kind, start in starts]
        where = {"key": key, **({"$or": either} if len(either) > 1 else either[0])}
        cursor = self._c("usage_hits").find(where, {"_id": 0, "kind": 1, "at": 1, "amount": 1}).sort("at", ASCENDING)
        hits = [(str(doc["kind"]), int(doc["at"]), int(doc.get("amount", 0))) async for doc in cursor]
        return [_tally([(at, amount) for k, at, amount in hits if k == kind and at >= start]) for kind, start in starts]

    @guarded
    async def prune_usage(self, before: datetime) -> int:
        return (await self._c("usage_hits").delete_many({"at": {"$lt": to_us(before)}})).deleted_count

    @guarded
    async def delete_usage(self, key: str) -> int:
        return (await self._c("usage_hits").delete_many({"key": key})).deleted_count

    @guarded
    async def set_usage_exempt(self, key: str, exempt: bool, at: datetime) -> bool:
        exemptions = self._c("usage_exempt")
        if not exempt:
            return bool((await exemptions.delete_one({"_id": key})).deleted_count)
        try:  # the _id index arbitrates, so two admins at once change it once
            await exemptions.insert_one({"_id": key, "since": to_us(at)})
        except DuplicateKeyError:
            return False
        return True

    @guarded
    async def usage_exempt(self, key: str) -> bool:
        return await self._c("usage_exempt").find_one({"_id": key}, {"_id": 1}) is not None

    @guarded
    async def list_usage_exempt(self) -> list[str]:
        cursor = self._c("usage_exempt").find({}, {"_id": 1}).sort("_id", ASCENDING)
        return [str(doc["_id"]) async for doc in cursor]
