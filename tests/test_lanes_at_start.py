"""At start, a new event must not overtake the replay of the same person's
older one (bot/durable/lanes.py: the start gate, closed, opened, and early holders)."""

from __future__ import annotations

import asyncio

from bot.durable.lanes import Lanes, StartGate


async def _take(lanes: Lanes, gate: StartGate, name: str, order: list[str], *, early: bool = False) -> None:
    async with lanes.hold("slack:T1:U1", after=None if early else gate):
        order.append(name)
        await asyncio.sleep(0)


async def test_held_back_new_events_wait_for_the_replays_then_keep_their_order() -> None:
    lanes, gate = Lanes(), StartGate()  # one start gate per platform (adapters/pipeline.py)
    gate.close()  # as hold_new_events() does before the adapters start
    order: list[str] = []
    new = [asyncio.create_task(_take(lanes, gate, f"new {n}", order)) for n in range(3)]
    await asyncio.sleep(0.01)
    assert order == []  # nothing runs before the last run's events are in line
    replays = [asyncio.create_task(_take(lanes, gate, f"replay {n}", order, early=True)) for n in range(2)]
    gate.open()  # as recover() does once the replays' tasks exist
    await asyncio.gather(*new, *replays)
    assert order == ["replay 0", "replay 1", "new 0", "new 1", "new 2"]


async def test_without_hold_back_nobody_waits() -> None:
    lanes, gate = Lanes(), StartGate()
    order: list[str] = []
    await _take(lanes, gate, "new", order)
    assert order == ["new"] and len(lanes) == 0


async def test_a_new_event_whose_task_has_not_run_yet_at_release_still_waits_for_the_replays() -> None:
    # The crash harness's "U3's message 5 answered 0 times, 11 answered 2 times":
    # a new message's receive and the start-up inbox read finish in the same
    # turn of the loop, so its task is created (but has not run its first step)
    # when recover() creates the replays' tasks and releases. Run in creation
    # order, that first step found the gate open and took the lane ahead of
    # the replay of the person's older message, which then answered the newer one.
    lanes, gate = Lanes(), StartGate()  # one start gate per platform (adapters/pipeline.py)
    gate.close()
    order: list[str] = []
    new = asyncio.create_task(_take(lanes, gate, "new", order))  # created, not yet run
    replay = asyncio.create_task(_take(lanes, gate, "replay", order, early=True))
    gate.open()  # in the same turn, as recover() does right after creating the replays' tasks
    await asyncio.gather(new, replay)
    assert order == ["replay", "new"]


async def test_new_events_keep_their_arrival_order_across_the_opening() -> None:
    # One waited at the gate; one came in the turn of the release, one in the
    # turn the gate opened (before the first has joined its lane).
    lanes, gate = Lanes(), StartGate()  # one start gate per platform (adapters/pipeline.py)
    gate.close()
    order: list[str] = []
    waiting = asyncio.create_task(_take(lanes, gate, "new 0", order))
    await asyncio.sleep(0)
    replay = asyncio.create_task(_take(lanes, gate, "replay", order, early=True))
    gate.open()
    late = [asyncio.create_task(_take(lanes, gate, "new 1", order))]
    await asyncio.sleep(0)  # the gate opens in this turn
    late.append(asyncio.create_task(_take(lanes, gate, "new 2", order)))
    await asyncio.gather(waiting, replay, *late)
    assert order == ["replay", "new 0", "new 1", "new 2"]
    assert len(lanes) == 0


async def test_a_holder_cancelled_at_the_gate_holds_nobody_up() -> None:
    lanes, gate = Lanes(), StartGate()  # one start gate per platform (adapters/pipeline.py)
    gate.close()
    order: list[str] = []
    gone = asyncio.create_task(_take(lanes, gate, "gone", order))
    stays = asyncio.create_task(_take(lanes, gate, "stays", order))
    await asyncio.sleep(0)
    gone.cancel()
    gate.open()
    await stays
    assert order == ["stays"]
