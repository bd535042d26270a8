"""MongoScheduleStore across processes: two stores with their own clients on
one database (FerretDB, whose updates are a read then a write, or the MongoDB
of MONGODB_TEST_URI). The behaviour both backends share is in test_checkins.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from memory.mongo.schedules import CLAIM_GRACE, MongoScheduleStore
from memory.schedules import Schedule
from tests.mongo_server import MongoTarget, mongo_target

__all__ = ["mongo_target"]  # the session fixture, imported to be found here

DUE = datetime(2026, 12, 1, 9, tzinfo=UTC)


@pytest.fixture
async def two(mongo_target: MongoTarget) -> AsyncIterator[tuple[MongoScheduleStore, MongoScheduleStore]]:
    first = mongo_target.store()
    await first.open()
    second = mongo_target.reopened(first.database)
    await second.open()
    try:
        a, b = first.schedules, second.schedules
        assert isinstance(a, MongoScheduleStore) and isinstance(b, MongoScheduleStore)
        yield a, b
    finally:
        await second.close()
        await first.close()  # drops the database


def daily(user: str) -> Schedule:
    return Schedule(
        id="",
        agent_key=f"discord:{user}",
        platform="discord",
        user_id=user,
        kind="daily",
        time_of_day="09:00",
        next_fire_at=DUE,
    )


async def test_two_processes_claiming_one_tick_exactly_one_wins(
    two: tuple[MongoScheduleStore, MongoScheduleStore],
) -> None:
    a, b = two
    for round_ in range(50):
        schedule = await a.add(daily(str(round_)))
        nxt = DUE + timedelta(days=1)
        wins = await asyncio.gather(
            a.claim(schedule.id, DUE, nxt, "a", fired_at=DUE),
            b.claim(schedule.id, DUE, nxt, "b", fired_at=DUE),
            a.claim(schedule.id, DUE, nxt, "a2", fired_at=DUE),
            b.claim(schedule.id, DUE, nxt, "b2", fired_at=DUE),
        )
        assert sum(wins) == 1, (round_, wins)
        claimed = await b.get(schedule.id)
        assert claimed is not None
        assert (claimed.next_fire_at, claimed.unanswered, claimed.last_fired_at) == (nxt, 1, DUE)
        assert claimed.claimed_by == ["a", "b", "a2", "b2"][wins.index(True)]


async def test_a_claim_whose_claimer_died_is_moved_along_unfired(
    two: tuple[MongoScheduleStore, MongoScheduleStore],
) -> None:
    a, b = two
    schedule = await a.add(daily("1"))
    nxt = DUE + timedelta(days=1)
    # A process recorded the claim and died before moving the schedule on.
    claims = a._store.collection("schedule_claims")
    await claims.insert_one(
        {
            "schedule_id": schedule.id,
            "due_at": DUE,
            "owner": "dead",
            "claimed_at": datetime.now(UTC) - CLAIM_GRACE - timedelta(seconds=1),
        }
    )
    assert not await b.claim(schedule.id, DUE, nxt, "b", fired_at=DUE)  # at most once: not fired again
    moved = await a.get(schedule.id)
    assert moved is not None and (moved.next_fire_at, moved.unanswered) == (nxt, 0)
    assert await a.claim(schedule.id, nxt, nxt + timedelta(days=1), "a", fired_at=nxt)  # the next tick is fine
    # A fresh claim of someone else (still at work) is left alone.
    other = await a.add(daily("2"))
    await claims.insert_one({"schedule_id": other.id, "due_at": DUE, "owner": "busy", "claimed_at": datetime.now(UTC)})
    assert not await b.claim(other.id, DUE, nxt, "b", fired_at=DUE)
    still = await a.get(other.id)
    assert still is not None and still.next_fire_at == DUE


async def test_claims_do_not_pile_up(two: tuple[MongoScheduleStore, MongoScheduleStore]) -> None:
    a, _ = two
    schedule = await a.add(daily("1"))
    due = DUE
    for _ in range(5):
        assert await a.claim(schedule.id, due, due + timedelta(days=1), "a", fired_at=due)
        due += timedelta(days=1)
    claims = a._store.collection("schedule_claims")
    assert await claims.count_documents({"schedule_id": schedule.id}) == 1  # only the latest tick's
    assert await a.delete(schedule.id)
    assert await claims.count_documents({"schedule_id": schedule.id}) == 0
