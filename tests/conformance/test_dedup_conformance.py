"""Store.first_delivery: a platform event id is handled once, however many
times and to however many processes it is delivered (Slack retries)."""

from __future__ import annotations

import asyncio

import pytest

from bot.dedup import StoreDeduper
from memory.store import DEDUP_TTL, Store


async def test_an_id_is_new_once(store: Store) -> None:
    assert await store.first_delivery("Ev01")
    assert not await store.first_delivery("Ev01")
    assert not await store.first_delivery("Ev01")
    assert await store.first_delivery("Ev02")  # ids are independent
    assert await store.first_delivery("ev01")  # and compared exactly


async def test_concurrent_deliveries_to_two_processes_are_new_exactly_once(store: Store, twin: Store) -> None:
    for n in range(10):
        event_id = f"Ev-race-{n}"
        results = await asyncio.gather(*(backend.first_delivery(event_id) for backend in (store, twin) * 5))
        assert sorted(results) == [False] * 9 + [True], event_id
    # Either instance knows what the other recorded.
    assert await twin.first_delivery("Ev-twin")
    assert not await store.first_delivery("Ev-twin")


async def test_an_id_is_forgotten_after_a_day(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    assert await store.first_delivery("Ev-old")
    assert not await store.first_delivery("Ev-old")
    clock = store._store_clock  # type: ignore[attr-defined]
    now = await clock()

    async def a_day_later() -> float:
        return now + DEDUP_TTL + 120

    monkeypatch.setattr(store, "_store_clock", a_day_later)
    assert await store.first_delivery("Ev-old")  # a new event that happens to reuse the id
    assert not await store.first_delivery("Ev-old")


async def test_store_deduper_is_the_slack_adapters_interface(store: Store, twin: Store) -> None:
    first, second = StoreDeduper(store), StoreDeduper(twin)
    assert await first.seen("Ev-slack") is False  # not seen before: handle it
    assert await second.seen("Ev-slack") is True  # a retry that reached another process
    assert await first.seen("Ev-slack") is True
