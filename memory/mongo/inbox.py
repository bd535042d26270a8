"""MongoStore's inbox and reply outbox: the InboxStore role
(memory/roles.py), as a mixin of MongoStore. The stored names are older than the
word "inbox" and stay (no migration for a name): the inbox is `event_journal`
(and `journal_claims`), and an entry's or a reply's platform is its `origin`.

    event_journal  {_id: event id, n, origin, agent_key, payload, received_at, state, attempts,
                    next_try_at, absorbed_into, owner, alone}
    journal_claims {_id: "<event id> <dead owner>", at}   one taker per dead owner
    outbox         {_id: "<event id>:<n>", event_id, position, agent_key, origin, user_id,
                    reply_to, text, created_at, state, attempts, next_try_at}

Recording is an insert against `_id`, the one write every MongoDB-compatible
server makes atomic (FerretDB has no transactions), so a repeat delivery or a
redone send can never record twice. State changes have one writer (the process
that owns the entry), so plain updates suffice; taking an entry over from a
dead process is arbitrated by an insert too (inbox_claim). `n` (nanoseconds at receipt,
made unique per process) orders redo; entries are swept a day after they finish.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, IndexModel
from pymongo.errors import DuplicateKeyError

from memory.mongo.base import Doc, MongoBase, from_us, to_us
from memory.mongo.capabilities import guarded
from memory.store import DEDUP_TTL, InboxEntry, OutboxEntry

INBOX_INDEXES: dict[str, list[IndexModel]] = {
    "event_journal": [
        IndexModel([("origin", ASCENDING), ("state", ASCENDING), ("n", ASCENDING)], name="origin_state_n"),
        IndexModel([("agent_key", ASCENDING)], name="agent_key"),
    ],
    "outbox": [
        IndexModel([("event_id", ASCENDING), ("position", ASCENDING)], name="event_position"),
        IndexModel([("origin", ASCENDING), ("state", ASCENDING), ("created_at", ASCENDING)], name="origin_state"),
        IndexModel([("agent_key", ASCENDING)], name="agent_key"),
    ],
    "messages": [IndexModel([("agent_id", ASCENDING), ("event_id", ASCENDING)], sparse=True, name="agent_event")],
}
_SWEEP_EVERY = 300.0
_CLAIM_ROUNDS = 20  # takers that died between claiming an entry and writing it, before giving up


def _inbox_entry(doc: Doc) -> InboxEntry:
    return InboxEntry(
        doc["_id"],
        doc["origin"],
        doc["agent_key"],
        doc["payload"],
        from_us(doc["received_at"]),
        doc["state"],
        doc.get("attempts", 0),
        doc.get("next_try_at", 0.0),
        doc.get("absorbed_into", ""),
        doc.get("owner", ""),
        bool(doc.get("alone", False)),
    )


def _outbox(doc: Doc) -> OutboxEntry:
    return OutboxEntry(
        doc["_id"],
        doc["event_id"],
        doc["position"],
        doc["agent_key"],
        doc["origin"],
        doc["user_id"],
        doc["reply_to"],
        doc["text"],
        from_us(doc["created_at"]),
        doc["state"],
        doc.get("attempts", 0),
        doc.get("next_try_at", 0.0),
    )


class MongoInbox(MongoBase):
    _last_inbox_sweep = 0.0
    _last_n = 0

    def _next_n(self) -> int:
        # Arrival order across processes to within clock skew; strictly rising here.
        self._last_n = max(time.time_ns(), self._last_n + 1)
        return self._last_n

    @guarded
    async def inbox_receive(self, entry: InboxEntry) -> bool:
        now = time.time()
        if now - self._last_inbox_sweep > _SWEEP_EVERY:
            self._last_inbox_sweep = now
            cutoff = to_us(datetime.fromtimestamp(now - DEDUP_TTL, UTC))
            await self._c("event_journal").delete_many({"state": "done", "received_at": {"$lt": cutoff}})
            await self._c("outbox").delete_many({"state": {"$ne": "pending"}, "created_at": {"$lt": cutoff}})
            await self._c("journal_claims").delete_many({"at": {"$lt": cutoff}})
        doc = {
            "_id": entry.event_id,
            "n": self._next_n(),
            "origin": entry.platform,
            "agent_key": entry.agent_key,
            "payload": entry.payload,
            "received_at": to_us(entry.received_at),
            "state": entry.state,
            "attempts": entry.attempts,
            "next_try_at": entry.next_try_at,
            "absorbed_into": entry.absorbed_into,
            "owner": entry.owner,
            "alone": entry.alone,
        }
        try:
            await self._c("event_journal").insert_one(doc)
        except DuplicateKeyError:
            return False
        return True

    @guarded
    async def inbox_update(
        self,
        event_id: str,
        *,
        state: str | None = None,
        attempts: int | None = None,
        next_try_at: float | None = None,
        alone: bool | None = None,
        only_from: Collection[str] = (),
    ) -> bool:
        fields: dict[str, Any] = {}
        if alone is not None:
            fields["alone"] = alone
        if state is not None:
            fields["state"] = state
        if attempts is not None:
            fields["attempts"] = attempts
        if next_try_at is not None:
            fields["next_try_at"] = next_try_at
        where: Doc = {"_id": event_id}
        if only_from:
            where["state"] = {"$in": list(only_from)}
        if not fields:
            return await self._c("event_journal").count_documents(where, limit=1) > 0
        return (await self._c("event_journal").update_one(where, {"$set": fields})).matched_count > 0

    @guarded
    async def inbox_start(self, event_id: str, *, alone: bool) -> bool:
        # `ran` marks a start for good; one debounced into another's batch may have had its
        # message recorded by that batch, so it does not count as never started either.
        before = await self._c("event_journal").find_one_and_update(
            {"_id": event_id, "state": "pending"},
            {"$set": {"state": "running", "alone": alone, "ran": True}},
        )  # the whole row: FerretDB 1.24 takes no projection here
        return before is not None and not before.get("ran") and not before.get("absorbed_into")

    @guarded
    async def inbox_entry(self, event_id: str) -> InboxEntry | None:
        doc = await self._c("event_journal").find_one({"_id": event_id})
        return None if doc is None else _inbox_entry(doc)

    @guarded
    async def inbox_claim(self, event_id: str, from_owner: str, to_owner: str) -> bool:
        claims, rows = self._c("journal_claims"), self._c("event_journal")
        # The arbiter: one claim per (entry, dead owner, round), whoever
        # inserts it first. A taker killed between its claim and its write of
        # the row would hold the entry forever: once it is dead too, and the
        # row still names the first owner, the next round is open.
        for round_ in range(_CLAIM_ROUNDS):
            claim = {"_id": f"{event_id} {from_owner}#{round_}", "taker": to_owner, "at": to_us(datetime.now(UTC))}
            try:
                await claims.insert_one(claim)
            except DuplicateKeyError:
                found = await claims.find_one({"_id": claim["_id"]})
                taker = "" if found is None else str(found.get("taker", ""))
                if taker != to_owner and taker in await self.lease_live({taker}):
                    return False  # taken by a live process
                if await rows.count_documents({"_id": event_id, "owner": from_owner}, limit=1) == 0:
                    return False  # the taker did write the row: it is no longer from_owner's
                if taker != to_owner:
                    continue
            changed = await rows.update_one({"_id": event_id, "owner": from_owner}, {"$set": {"owner": to_owner}})
            return changed.matched_count > 0
        return False

    # MongoCoordination's (memory/mongo/coordination.py): MongoStore has both.
    lease_live: Callable[[Collection[str]], Awaitable[set[str]]]

    @guarded
    async def inbox_absorb(self, leader_id: str, event_ids: Sequence[str]) -> None:
        if event_ids:
            await self._c("event_journal").update_many(
                {"_id": {"$in": list(event_ids)}}, {"$set": {"absorbed_into": leader_id}}
            )

    @guarded
    async def inbox_pending(self, platform: str, due_by: float | None = None) -> list[InboxEntry]:
        where: Doc = {"origin": platform, "state": {"$ne": "done"}}
        if due_by is not None:  # the waiting ones due by then
            where |= {"state": "waiting", "next_try_at": {"$lte": due_by}}
        cursor = self._c("event_journal").find(where).sort("n", ASCENDING)
        return [_inbox_entry(doc) async for doc in cursor]

    @guarded
    async def outbox_add(self, entry: OutboxEntry) -> bool:
        doc = {
            "_id": entry.id,
            "event_id": entry.event_id,
            "position": entry.position,
            "agent_key": entry.agent_key,
            "origin": entry.platform,
            "user_id": entry.user_id,
            "reply_to": entry.reply_to,
            "text": entry.text,
            "created_at": to_us(entry.created_at),
            "state": entry.state,
            "attempts": entry.attempts,
            "next_try_at": entry.next_try_at,
        }
        try:
            await self._c("outbox").insert_one(doc)
        except DuplicateKeyError:
            return False
        return True

    @guarded
    async def outbox_update(
        self, entry_id: str, *, state: str, attempts: int | None = None, next_try_at: float | None = None
    ) -> None:
        fields: dict[str, Any] = {"state": state}
        if attempts is not None:
            fields["attempts"] = attempts
        if next_try_at is not None:
            fields["next_try_at"] = next_try_at
        await self._c("outbox").update_one({"_id": entry_id}, {"$set": fields})

    @guarded
    async def outbox_for_event(self, event_id: str) -> list[OutboxEntry]:
        cursor = self._c("outbox").find({"event_id": event_id}).sort("position", ASCENDING)
        return [_outbox(doc) async for doc in cursor]

    @guarded
    async def outbox_pending(self, platform: str, due_by: float | None = None) -> list[OutboxEntry]:
        where: Doc = {"origin": platform, "state": "pending"}
        if due_by is not None:
            where["next_try_at"] = {"$lte": due_by}
        cursor = (
            self._c("outbox")
            .find(where)
            .sort([("created_at", ASCENDING), ("event_id", ASCENDING), ("position", ASCENDING)])
        )
        return [_outbox(doc) async for doc in cursor]

    @guarded
    async def inbox_scrub(self, agent_key: str, *, forgotten_at: datetime | None = None) -> None:
        # Rewritten, not deleted: their ids drop repeat deliveries. Each update is
        # idempotent, so a forget redone after a fault finishes the job.
        rows, replies = self._c("event_journal"), self._c("outbox")
        if forgotten_at is not None:
            before = to_us(forgotten_at)
            await rows.update_many(
                {"agent_key": agent_key, "received_at": {"$lte": before}},
                {"$set": {"state": "done", "payload": {}, "agent_key": ""}},
            )
            unsent = {"agent_key": agent_key, "created_at": {"$lte": before}, "state": "pending"}
            await replies.update_many(unsent, {"$set": {"state": "dropped"}})
            await replies.update_many(
                {"agent_key": agent_key, "created_at": {"$lte": before}},
                {"$set": {"text": "", "user_id": "", "reply_to": {}, "agent_key": ""}},
            )
        await rows.update_many({"agent_key": agent_key, "state": "done"}, {"$set": {"payload": {}}})
        await replies.update_many({"agent_key": agent_key, "state": {"$ne": "pending"}}, {"$set": {"text": ""}})

    @guarded
    async def event_message_seq(self, agent_id: str, event_id: str) -> int | None:
        doc = await self._c("messages").find_one(
            {"agent_id": agent_id, "event_id": event_id}, {"seq": 1}, sort=[("seq", ASCENDING)]
        )
        return None if doc is None else int(doc["seq"])
