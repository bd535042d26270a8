"""Usage counters (Store.record_usage and friends): what bot/limits.py builds the
message rate limit and the daily token budget on, the same on every backend
and across processes sharing one database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from memory.store import Store

T0 = datetime(2030, 5, 17, 12, 0, 0, 123_456, tzinfo=UTC)


async def test_hits_are_counted_and_summed_over_a_window(store: Store) -> None:
    empty = await store.usage_since("discord:1", "tokens", T0 - timedelta(days=1))
    assert (empty.count, empty.amount, empty.oldest, empty.newest) == (0, 0, None, None)
    for seconds, amount in ((0, 100), (30, 250), (90, 40)):
        await store.record_usage("discord:1", {"tokens": amount}, T0 + timedelta(seconds=seconds))
    await store.record_usage("discord:1", {"message": 1}, T0)  # another kind
    await store.record_usage("discord:2", {"tokens": 999}, T0)  # another user

    every = await store.usage_since("discord:1", "tokens", T0)  # `since` itself is included
    assert (every.count, every.amount) == (3, 390)
    assert every.oldest == T0  # microseconds survive the round trip
    assert every.newest == T0 + timedelta(seconds=90)
    later = await store.usage_since("discord:1", "tokens", T0 + timedelta(seconds=1))
    assert (later.count, later.amount, later.oldest) == (2, 290, T0 + timedelta(seconds=30))
    assert (await store.usage_since("discord:1", "message", T0)).count == 1
    assert (await store.usage_since("discord:2", "tokens", T0)).amount == 999


async def test_several_kinds_are_counted_in_one_call(store: Store) -> None:
    await store.record_usage("slack:T1:U2", {"tokens": 120, "prompt_tokens": 100, "completion_tokens": 20}, T0)
    await store.record_usage("slack:T1:U2", {}, T0)  # nothing to count
    tallies = {
        kind: await store.usage_since("slack:T1:U2", kind, T0)
        for kind in ("tokens", "prompt_tokens", "completion_tokens")
    }
    assert {kind: (t.count, t.amount, t.newest) for kind, t in tallies.items()} == {
        "tokens": (1, 120, T0),
        "prompt_tokens": (1, 100, T0),
        "completion_tokens": (1, 20, T0),
    }


async def test_concurrent_hits_from_two_processes_are_all_counted(store: Store, twin: Store) -> None:
    # What a shared `$inc` would get wrong on FerretDB: every hit must land.
    hits = [
        backend.record_usage("slack:T1:U1", {"message": 1}, T0 + timedelta(milliseconds=n))
        for n, backend in enumerate((store, twin) * 25)
    ]
    await asyncio.gather(*hits)
    for backend in (store, twin):
        found = await backend.usage_since("slack:T1:U1", "message", T0)
        assert (found.count, found.amount) == (50, 50)


async def test_prune_drops_old_hits_of_every_key(store: Store) -> None:
    for key in ("discord:1", "discord:2"):
        await store.record_usage(key, {"tokens": 10}, T0 - timedelta(days=3))
        await store.record_usage(key, {"tokens": 20}, T0)
    assert await store.prune_usage(T0 - timedelta(days=2)) == 2
    for key in ("discord:1", "discord:2"):
        found = await store.usage_since(key, "tokens", T0 - timedelta(days=10))
        assert (found.count, found.amount) == (1, 20)
    assert await store.prune_usage(T0 - timedelta(days=2)) == 0


async def test_delete_usage_forgets_one_key_and_keeps_its_exemption(store: Store) -> None:
    await store.record_usage("discord:1", {"tokens": 10}, T0)
    await store.record_usage("discord:1", {"message": 1}, T0)
    await store.record_usage("discord:2", {"tokens": 10}, T0)
    await store.set_usage_exempt("discord:1", True, T0)
    assert await store.delete_usage("discord:1") == 2
    assert (await store.usage_since("discord:1", "tokens", T0)).count == 0
    assert (await store.usage_since("discord:2", "tokens", T0)).count == 1
    assert await store.usage_exempt("discord:1")
    assert await store.delete_usage("discord:1") == 0


async def test_exemptions_are_set_once_and_shared(store: Store, twin: Store) -> None:
    assert await store.list_usage_exempt() == []
    assert not await store.usage_exempt("slack:T1:U2")
    results = await asyncio.gather(*(b.set_usage_exempt("slack:T1:U2", True, T0) for b in (store, twin) * 3))
    assert sorted(results) == [False] * 5 + [True]  # exactly one call changed it
    await store.set_usage_exempt("discord:9", True, T0)
    assert await twin.usage_exempt("slack:T1:U2")
    assert await twin.list_usage_exempt() == ["discord:9", "slack:T1:U2"]
    assert await twin.set_usage_exempt("slack:T1:U2", False, T0)
    assert not await twin.set_usage_exempt("slack:T1:U2", False, T0)
    assert not await store.usage_exempt("slack:T1:U2")
    assert await store.list_usage_exempt() == ["discord:9"]


async def test_usage_windows_reads_every_window_at_once(store: Store) -> None:
    key = "slack:T1:U7"
    for seconds, kind, amount in ((0, "tokens", 70), (20, "message", 1), (40, "message", 1), (50, "tokens", 5)):
        await store.record_usage(key, {kind: amount}, T0 + timedelta(seconds=seconds))
    later = T0 + timedelta(seconds=45)
    windows = [("tokens", T0), ("message", T0 + timedelta(seconds=30)), ("notice:rate", T0), ("tokens", later)]
    tallies = await store.usage_windows(key, windows)
    assert tallies == [await store.usage_since(key, kind, since) for kind, since in windows]
    assert [(t.count, t.amount) for t in tallies] == [(2, 75), (1, 1), (0, 0), (1, 5)]  # a kind twice: each its own
    assert await store.usage_windows(key, []) == []
