"""The check-in schedule store on MongoDB, in the MongoStore's database, so
every bot process on that database sees the same schedules.

    schedules         {_id: schedule id, agent_key, platform, user_id, kind, timezone, time_of_day, weekday,
                       every_hours, run_at, quiet_start, quiet_end, note, reply_to (JSON text), paused,
                       next_fire_at, unanswered, last_fired_at, created_at, claimed_by, order}
    schedule_claims   {schedule_id, due_at, owner, claimed_at}      unique (schedule_id, due_at)
    checkin_prefs     {_id: agent key, timezone, quiet_start, quiet_end, updated_at}

Times are BSON dates holding whole seconds (see memory/schedules.py), so
`claim` compares them exactly. `order` (nanoseconds, strictly increasing in a
process) keeps "oldest first" stable for schedules created in the same second.

Exactly-once `claim` on servers without an atomic update (FerretDB runs an
update with a filter as a read, then a write: two processes can both "match"
next_fire_at == due): the arbiter is an insert into `schedule_claims`, whose
unique (schedule_id, due_at) index lets exactly one process record the tick;
only that one then moves next_fire_at along. A claimer that dies between the
two writes would leave the schedule stuck on a tick nobody can claim, so a
claim that finds a record older than CLAIM_GRACE for a schedule still sitting
on that tick moves it along *without* firing it (a tick is fired at most
once: a missing check-in is better than a double one).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError, PyMongoError

from memory.mongo.base import Doc, MongoBase
from memory.mongo.capabilities import guarded
from memory.schedules import (
    EDITABLE_FIELDS,
    STORED_FIELDS,
    CheckinPrefs,
    Schedule,
    ScheduleStore,
    new_schedule_id,
    stored_fields,
    stored_schedule,
    whole_seconds,
)
from memory.store import StoreError
from memory.types import utc_now

SCHEDULE_INDEXES: dict[str, list[IndexModel]] = {
    "schedules": [
        IndexModel([("agent_key", ASCENDING), ("order", ASCENDING)], name="agent_key_order"),
        IndexModel([("paused", ASCENDING), ("next_fire_at", ASCENDING)], name="due"),
        IndexModel([("order", ASCENDING)], name="order"),
    ],
    "schedule_claims": [
        IndexModel([("schedule_id", ASCENDING), ("due_at", ASCENDING)], unique=True, name="schedule_due_unique"),
    ],
}
CLAIM_GRACE = timedelta(seconds=60)  # a claim this old whose schedule did not move: its claimer died


def _utc(value: Any) -> datetime | None:
    # PyMongo hands out naive UTC datetimes unless the client is tz_aware.
    if value is None:
        return None
    moment: datetime = value
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _schedule(doc: Doc) -> Schedule:
    return stored_schedule(doc["_id"], doc, _utc)


class MongoScheduleStore(ScheduleStore):
    def __init__(self, store: MongoBase) -> None:
        self._store = store
        self._last_order = 0

    def error(self, action: str, exc: PyMongoError) -> StoreError:
        return self._store.error(action, exc)

    def _c(self, name: str) -> AsyncCollection[Doc]:
        return self._store.collection(name)

    def _next_order(self) -> int:
        self._last_order = max(time.time_ns(), self._last_order + 1)
        return self._last_order

    async def _find(self, where: Doc, sort: Sequence[tuple[str, int]] = (("order", ASCENDING),)) -> list[Schedule]:
        cursor = self._c("schedules").find(where).sort(list(sort))
        return [_schedule(doc) async for doc in cursor]

    @guarded
    async def add(self, schedule: Schedule) -> Schedule:
        doc: Doc = {**stored_fields(schedule, STORED_FIELDS, whole_seconds), "order": self._next_order()}
        for _ in range(8):
            candidate = schedule.id or new_schedule_id()
            try:
                await self._c("schedules").insert_one({"_id": candidate, **doc})
            except DuplicateKeyError:
                if schedule.id:
                    raise ValueError(f"schedule id {schedule.id!r} is taken") from None
                continue
            schedule.id = candidate
            return schedule
        raise RuntimeError("could not find a free schedule id")

    @guarded
    async def update(self, schedule: Schedule) -> bool:
        fields = stored_fields(schedule, EDITABLE_FIELDS, whole_seconds)
        result = await self._c("schedules").update_one({"_id": schedule.id}, {"$set": fields})
        return bool(result.matched_count)

    @guarded
    async def get(self, schedule_id: str) -> Schedule | None:
        doc = await self._c("schedules").find_one({"_id": schedule_id})
        return None if doc is None else _schedule(doc)

    @guarded
    async def list_for_user(self, agent_key: str) -> list[Schedule]:
        return await self._find({"agent_key": agent_key})

    @guarded
    async def list_all(self) -> list[Schedule]:
        return await self._find({})

    @guarded
    async def list_due(self, now: datetime) -> list[Schedule]:
        where = {"paused": False, "next_fire_at": {"$lte": whole_seconds(now)}}
        return await self._find(where, (("next_fire_at", ASCENDING), ("order", ASCENDING)))

    @guarded
    async def delete(self, schedule_id: str) -> bool:
        deleted = (await self._c("schedules").delete_one({"_id": schedule_id})).deleted_count
        await self._c("schedule_claims").delete_many({"schedule_id": schedule_id})
        return bool(deleted)

    @guarded
    async def delete_for_agent_key(self, agent_key: str) -> int:
        await self._c("checkin_prefs").delete_one({"_id": agent_key})
        ids = [doc["_id"] async for doc in self._c("schedules").find({"agent_key": agent_key}, {"_id": 1})]
        if not ids:
            return 0
        deleted = (await self._c("schedules").delete_many({"_id": {"$in": ids}})).deleted_count
        await self._c("schedule_claims").delete_many({"schedule_id": {"$in": ids}})
        return int(deleted)

    @guarded
    async def claim(
        self,
        schedule_id: str,
        due_at: datetime,
        next_fire_at: datetime | None,
        owner: str,
        *,
        fired_at: datetime | None = None,
    ) -> bool:
        due = whole_seconds(due_at)
        schedules, claims = self._c("schedules"), self._c("schedule_claims")
        doc = await schedules.find_one({"_id": schedule_id}, {"paused": 1, "next_fire_at": 1})
        if doc is None or doc.get("paused") or _utc(doc.get("next_fire_at")) != due:
            return False  # the cheap, common answer for the processes that lose
        try:
            await claims.insert_one(
                {"schedule_id": schedule_id, "due_at": due, "owner": owner, "claimed_at": whole_seconds(utc_now())}
            )
        except DuplicateKeyError:
            await self._unstick(schedule_id, due, next_fire_at)
            return False
        # Ours alone from here: the filter only re-checks that nobody paused
        # or edited the schedule since we read it.
        where = {"_id": schedule_id, "next_fire_at": due, "paused": False}
        if next_fire_at is None:
            won = (await schedules.delete_one(where)).deleted_count
            await claims.delete_many({"schedule_id": schedule_id})
            return bool(won)
        change: Doc = {"$set": {"next_fire_at": whole_seconds(next_fire_at), "claimed_by": owner}}
        if fired_at is not None:
            change["$set"]["last_fired_at"] = whole_seconds(fired_at)
            change["$inc"] = {"unanswered": 1}
        won = (await schedules.update_one(where, change)).matched_count
        # Earlier ticks of this schedule are behind it for good: their claims
        # can go (one record per schedule stays, not one per tick).
        await claims.delete_many({"schedule_id": schedule_id, "due_at": {"$lt": due}})
        return bool(won)

    async def _unstick(self, schedule_id: str, due: datetime, next_fire_at: datetime | None) -> None:
        """Someone claimed this tick. If long ago and the schedule still sits on
        it, they died before moving it: move it along, unfired."""
        record = await self._c("schedule_claims").find_one({"schedule_id": schedule_id, "due_at": due})
        claimed_at = _utc(record.get("claimed_at")) if record else None
        if claimed_at is None or utc_now() - claimed_at < CLAIM_GRACE:
            return
        where = {"_id": schedule_id, "next_fire_at": due, "paused": False}
        if next_fire_at is None:
            await self._c("schedules").delete_one(where)
        else:
            await self._c("schedules").update_one(where, {"$set": {"next_fire_at": whole_seconds(next_fire_at)}})

    @guarded
    async def mark_user_activity(self, agent_key: str, at: datetime) -> list[Schedule]:
        where = {
            "agent_key": agent_key,
            "unanswered": {"$gt": 0},
            "$or": [{"last_fired_at": None}, {"last_fired_at": {"$lte": whole_seconds(at)}}],
        }
        found = await self._find(where)
        if found:
            await self._c("schedules").update_many(
                {"_id": {"$in": [s.id for s in found]}, **where}, {"$set": {"unanswered": 0}}
            )
        return found

    @guarded
    async def get_prefs(self, agent_key: str) -> CheckinPrefs:
        doc = await self._c("checkin_prefs").find_one({"_id": agent_key})
        if doc is None:
            return CheckinPrefs(agent_key)
        return CheckinPrefs(agent_key, doc.get("timezone"), doc.get("quiet_start"), doc.get("quiet_end"))

    @guarded
    async def save_prefs(self, prefs: CheckinPrefs) -> None:
        doc = {
            "_id": prefs.agent_key,
            "timezone": prefs.timezone,
            "quiet_start": prefs.quiet_start,
            "quiet_end": prefs.quiet_end,
            "updated_at": whole_seconds(utc_now()),
        }
        prefs_docs = self._c("checkin_prefs")
        try:
            await prefs_docs.replace_one({"_id": prefs.agent_key}, doc, upsert=True)
        except DuplicateKeyError:  # a concurrent first save inserted it: ours replaces it
            await prefs_docs.replace_one({"_id": prefs.agent_key}, doc)
