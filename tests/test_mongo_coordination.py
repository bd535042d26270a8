"""MongoDB-specific parts of process coordination (memory/mongo/coordination.py)
that the shared conformance suite cannot reach: a ticket number handed out
twice, the server clock, the TTL index fallback."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pymongo.asynchronous.collection import AsyncCollection

from memory.mongo.store import MongoStore
from memory.sqlite.coordination import CLEAR_EVERY
from tests.mongo_server import mongo_store, mongo_target, mongo_twin

__all__ = ["mongo_store", "mongo_target", "mongo_twin"]  # the session fixture, imported to be found here


@pytest.fixture
def store(mongo_store: MongoStore) -> MongoStore:
    return mongo_store


@pytest.fixture
def other(mongo_twin: MongoStore) -> MongoStore:
    """The same database as another bot process sees it (its own connection, its own memory)."""
    return mongo_twin


def watch_reads_of_the_highest(monkeypatch: pytest.MonkeyPatch, stale: int = 0) -> list[str]:
    """Every read of a line's highest ticket (lease_join's sorted find_one),
    from now on, by any store; the first `stale` of them answer "no ticket yet"."""
    reads: list[str] = []
    real_find_one = AsyncCollection.find_one

    async def find_one(self: AsyncCollection[Any], *args: Any, **kwargs: Any) -> Any:
        if self.name == "lease_tickets" and kwargs.get("sort"):
            reads.append("highest")
            if len(reads) <= stale:
                return None
        return await real_find_one(self, *args, **kwargs)

    monkeypatch.setattr(AsyncCollection, "find_one", find_one)
    return reads


async def test_a_number_cleared_away_meanwhile_is_given_up(
    store: MongoStore, other: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.lease_register("a", 30)
    await other.lease_register("slow", 30)
    first = await store.lease_join("k", "a")
    second = await store.lease_join("k", "a")
    await store.lease_leave("k", first, "a")  # done and cleared: number 1 is free again
    assert await store.lease_position("k", second, "a") == 0  # ticket 2 holds the lease
    # A joiner that read the highest number before ticket 1 existed, and
    # inserts only now, would get number 1: below the holder.
    reads = watch_reads_of_the_highest(monkeypatch, stale=1)
    seq = await other.lease_join("k", "slow")  # another process: it has drawn nothing in this line yet
    assert reads  # it did read the stale "no ticket yet"
    assert seq == second + 1  # gave number 1 up and drew again
    assert await store.lease_position("k", second, "a") == 0  # the holder still holds
    assert await store.lease_position("k", seq, "slow") == 1
    assert await store.collection("lease_tickets").find_one({"name": "k", "seq": 1, "done": False}) is None


async def test_the_first_position_after_a_join_is_read_with_the_join_when_nobody_is_ahead(
    store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.lease_register("a", 30)
    seq = await store.lease_join("k", "a")
    reads: list[Any] = []
    real_find = AsyncCollection.find

    def find(self: AsyncCollection[Any], *args: Any, **kwargs: Any) -> Any:
        if self.name == "lease_tickets":
            reads.append(args)
        return real_find(self, *args, **kwargs)

    monkeypatch.setattr(AsyncCollection, "find", find)
    assert await store.lease_position("k", seq, "a") == 0
    assert reads == []  # lease_join's check read the line too
    assert await store.lease_position("k", seq, "a") == 0  # a later poll reads it again
    assert len(reads) == 1


async def test_times_are_the_servers(store: MongoStore) -> None:
    # FerretDB runs on this machine: the measured offset is about the round trip.
    assert abs(await store._store_clock() - time.time()) < 1.0


async def test_the_number_after_our_last_ticket_is_tried_first_and_checked(
    store: MongoStore, other: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.lease_register("here", 30)
    await other.lease_register("there", 30)
    first = await store.lease_join("k", "here")
    await store.lease_leave("k", first, "here")
    reads = watch_reads_of_the_highest(monkeypatch)
    # The line's events kept coming here: the next number, without reading the line.
    again = await store.lease_join("k", "here")
    assert (again, reads) == (first + 1, [])
    await store.lease_leave("k", again, "here")

    # Then the line moved to the other process for a while: our guess is taken.
    theirs = await other.lease_join("k", "there")
    assert theirs == again + 1
    reads.clear()  # (the other process read the line: it had drawn nothing in it)
    mine = await store.lease_join("k", "here")
    assert mine == theirs + 1 and reads == ["highest"]
    assert await store.lease_position("k", mine, "here") == 1  # behind the other process's ticket
    await other.lease_leave("k", theirs, "there")
    assert await store.lease_position("k", mine, "here") == 0
    await store.lease_leave("k", mine, "here")

    # Or its numbers were taken and cleared away, all but the highest: our
    # guess is free, but below the line's end; given up, and drawn again.
    tickets = []
    while not tickets or tickets[-1] % CLEAR_EVERY:
        tickets.append(await other.lease_join("k", "there"))
        await other.lease_leave("k", tickets[-1], "there")
    assert await store.collection("lease_tickets").find_one({"name": "k", "seq": mine + 1}) is None  # cleared
    reads.clear()
    latest = await store.lease_join("k", "here")
    assert latest == tickets[-1] + 1 and reads == ["highest"]
    assert await store.lease_position("k", latest, "here") == 0
    assert await store.collection("lease_tickets").find_one({"name": "k", "seq": mine + 1, "done": False}) is None
