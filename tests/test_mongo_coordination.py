"""MongoDB-specific parts of process coordination (memory/mongo/coordination.py)
that the shared conformance suite cannot reach: a ticket number handed out
twice, the server clock, the TTL index fallback."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pymongo.asynchronous.collection import AsyncCollection

from memory.mongo.store import MongoStore
from tests.mongo_server import mongo_store, mongo_target

__all__ = ["mongo_store", "mongo_target"]  # the session fixture, imported to be found here


@pytest.fixture
def store(mongo_store: MongoStore) -> MongoStore:
    return mongo_store


async def test_a_number_cleared_away_meanwhile_is_given_up(store: MongoStore, monkeypatch: pytest.MonkeyPatch) -> None:
    await store.lease_register("a", 30)
    await store.lease_register("slow", 30)
    first = await store.lease_join("k", "a")
    second = await store.lease_join("k", "a")
    await store.lease_leave("k", first, "a")  # done and cleared: number 1 is free again
    assert await store.lease_position("k", second, "a") == 0  # ticket 2 holds the lease
    # A joiner that read the highest number before ticket 1 existed, and
    # inserts only now, would get number 1: below the holder.
    real_find_one = AsyncCollection.find_one
    stale = [True]

    async def find_one(self: AsyncCollection[Any], *args: Any, **kwargs: Any) -> Any:
        if self.name == "lease_tickets" and kwargs.get("sort") and stale:
            stale.clear()
            return None  # "no ticket yet"
        return await real_find_one(self, *args, **kwargs)

    monkeypatch.setattr(AsyncCollection, "find_one", find_one)
    seq = await store.lease_join("k", "slow")
    assert seq == second + 1  # gave number 1 up and drew again
    assert await store.lease_position("k", second, "a") == 0  # the holder still holds
    assert await store.lease_position("k", seq, "slow") == 1
    assert await store.collection("lease_tickets").find_one({"name": "k", "seq": 1, "done": False}) is None


async def test_times_are_the_servers(store: MongoStore) -> None:
    # FerretDB runs on this machine: the measured offset is about the round trip.
    assert abs(await store._store_clock() - time.time()) < 1.0
