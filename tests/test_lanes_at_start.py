"""At start, a new event must not overtake the replay of the same person's
older one (bot/durable/lanes.py: hold_back, release, early holders)."""

from __future__ import annotations

import asyncio

from bot.durable.lanes import Lanes


async def _take(lanes: Lanes, name: str, order: list[str], *, early: bool = False) -> None:
    async with lanes.hold("slack:T1:U1", early=early):
        order.append(name)
        await asyncio.sleep(0)


async def test_held_back_new_events_wait_for_the_replays_then_keep_their_order() -> None:
    lanes = Lanes()
    lanes.hold_back()  # as serve() does before the adapters start
    order: list[str] = []
    new = [asyncio.create_task(_take(lanes, f"new {n}", order)) for n in range(3)]
    await asyncio.sleep(0.01)
    assert order == []  # nothing runs before the last run's events are in line
    replays = [asyncio.create_task(_take(lanes, f"replay {n}", order, early=True)) for n in range(2)]
    lanes.release()  # as recover() does once the replays' tasks exist
    await asyncio.gather(*new, *replays)
    assert order == ["replay 0", "replay 1", "new 0", "new 1", "new 2"]


async def test_without_hold_back_nobody_waits() -> None:
    lanes = Lanes()
    order: list[str] = []
    await _take(lanes, "new", order)
    assert order == ["new"] and len(lanes) == 0
