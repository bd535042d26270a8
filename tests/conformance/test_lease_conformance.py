"""Agent leases on every backend: the store's owners and ticket lines
(Store.lease_*) and the protocol on top of them (bot/durable/leases.py), with two store
instances standing for two bot processes. Real processes, killed mid-event:
tests/test_multiprocess.py."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bot.durable.inbox import Inbox
from bot.durable.leases import AgentLeases, LeaseLostError, LeaseTimeoutError, NoLeases, leases_for
from bot.settings import LeaseSettings
from memory.mongo.store import MongoStore
from memory.store import Store, StoreError


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 60.0) -> None:
    """Poll `check` until it holds; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def position_is(store: Store, name: str, seq: int, owner: str, expected: int | None) -> bool:
    return await store.lease_position(name, seq, owner) == expected


# -- the store: owners and lines -----------------------------------------------------
async def test_tickets_hold_the_lease_in_order(store: Store) -> None:
    await store.lease_register("a", 30)
    await store.lease_register("b", 30)
    first = await store.lease_join("slack:T1:U1", "a")
    second = await store.lease_join("slack:T1:U1", "b")
    third = await store.lease_join("slack:T1:U1", "a")
    other = await store.lease_join("discord:9", "b")
    assert (second, third) == (first + 1, first + 2)
    assert await store.lease_position("slack:T1:U1", first, "a") == 0  # holds the lease
    assert await store.lease_position("slack:T1:U1", second, "b") == 1
    assert await store.lease_position("slack:T1:U1", third, "a") == 2
    assert await store.lease_position("discord:9", other, "b") == 0  # lines are per agent
    assert await store.lease_position("slack:T1:U1", second, "a") is None  # not a's ticket
    await store.lease_leave("slack:T1:U1", first, "a")
    assert await store.lease_position("slack:T1:U1", second, "b") == 0
    assert await store.lease_position("slack:T1:U1", first, "a") is None  # done for good
    for seq, owner in ((second, "b"), (third, "a")):
        await store.lease_leave("slack:T1:U1", seq, owner)
    # Numbers only grow, even after the line emptied and was cleared.
    assert await store.lease_join("slack:T1:U1", "a") == third + 1


async def test_a_dead_owners_tickets_are_passed_and_it_cannot_come_back(store: Store) -> None:
    await store.lease_register("crashed", 0.3)
    await store.lease_register("alive", 30)
    assert await store.lease_renew("crashed", 0.3)
    dead = await store.lease_join("k", "crashed")
    waiting = await store.lease_join("k", "alive")
    assert await store.lease_position("k", waiting, "alive") == 1
    # The crashed owner stops renewing: after its ttl the next ticket holds the lease.
    await eventually(lambda: position_is(store, "k", waiting, "alive", 0))
    assert await store.lease_position("k", dead, "crashed") is None
    assert not await store.lease_renew("crashed", 30)  # a late renewal is refused
    assert await store.lease_position("k", waiting, "alive") == 0
    assert not await store.lease_renew("never-registered", 30)
    await store.lease_leave("k", waiting, "alive")
    assert await store.lease_join("k", "alive") == waiting + 1


async def test_two_processes_joining_at_once_get_distinct_places(store: Store, twin: Store) -> None:
    for n in range(20):
        await store.lease_register(f"o{n}", 30)
    backends = enumerate((store, twin) * 10)
    joins = await asyncio.gather(*(backend.lease_join("k", f"o{n}") for n, backend in backends))
    assert len(set(joins)) == 20
    positions = [await twin.lease_position("k", seq, f"o{n}") for n, seq in enumerate(joins)]
    # Tickets given up in a race (MongoDB draws again) are done: the rest form one line.
    assert sorted(positions) == list(range(20))  # type: ignore[type-var]
    assert positions[joins.index(min(joins))] == 0


# -- the protocol (bot/durable/leases.py) ---------------------------------------------------
def fast(**overrides: float) -> LeaseSettings:
    values = {"ttl": 2.0, "renew_every": 0.3, "max_wait": 10.0, **overrides}
    return LeaseSettings(mode="on", **values)  # type: ignore[arg-type]


@pytest.fixture
async def processes(store: Store, twin: Store) -> AsyncIterator[list[AgentLeases]]:
    """Two "bot processes": lease managers on two store instances of one database."""
    made = [AgentLeases(store, fast(), name="A"), AgentLeases(twin, fast(), name="B")]
    yield made
    for leases in made:
        await leases.close()


async def test_two_processes_take_turns_in_arrival_order(processes: list[AgentLeases]) -> None:
    a, b = processes
    inside: list[str] = []
    entered: list[tuple[str, int, bool]] = []

    async def event(leases: AgentLeases, n: int) -> None:
        async with leases.hold("discord:1") as turn:
            inside.append(leases.name)
            assert len(inside) == 1, inside  # never two at once, across processes
            entered.append((leases.name, n, turn.continuous))
            await asyncio.sleep(0.005)  # simulated work
            inside.remove(leases.name)

    await asyncio.gather(*(event(a if n % 3 else b, n) for n in range(24)))
    assert len(entered) == 24
    # Within a process, in the order of the calls.
    for name in "AB":
        calls = [n for who, n, _ in entered if who == name]
        assert calls == sorted(calls)
    # A turn is continuous exactly when the same process held the agent the turn before.
    for (before, _, _), (now, _, continuous) in itertools.pairwise(entered):
        assert continuous == (before == now)
    assert entered[0][2] is False  # nobody's copy is trusted on a first turn


async def test_a_process_that_cannot_renew_stops_its_work(
    store: Store, processes: list[AgentLeases], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = processes
    a.settings = fast(ttl=1.0, renew_every=0.2)

    async def unreachable(*args: object) -> bool:
        raise StoreError("connection refused")

    started = time.monotonic()
    with pytest.raises(LeaseLostError):
        async with a.hold("k") as turn:
            assert not turn.continuous
            monkeypatch.setattr(store, "lease_renew", unreachable)
            await asyncio.sleep(30)  # the heartbeat cancels this at 0.8 ttl
    assert time.monotonic() - started < 1.5  # 0.8 s, plus scheduling slack
    monkeypatch.undo()
    # The other process gets the agent, and does not trust its cache.
    async with b.hold("k") as turn:
        assert not turn.continuous
    # The first starts over under a new owner id, and reloads too.
    async with a.hold("k") as turn:
        assert not turn.continuous


async def test_waiting_is_bounded(processes: list[AgentLeases]) -> None:
    a, b = processes
    b.settings = fast(max_wait=0.3)
    async with a.hold("k"):
        with pytest.raises(LeaseTimeoutError):
            async with b.hold("k"):
                pytest.fail("entered while another process held the lease")
    async with b.hold("k") as turn:  # the timed-out ticket left the line
        assert not turn.continuous


async def test_a_failed_leave_retires_the_owner_so_the_line_moves_on(
    store: Store, processes: list[AgentLeases], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = processes

    async def broken(*args: object) -> None:
        raise StoreError("connection reset")

    monkeypatch.setattr(store, "lease_leave", broken)
    async with a.hold("k"):
        pass
    monkeypatch.undo()
    # A's ticket is still live in the store; A stops renewing that owner, so
    # it dies within the ttl and B gets the agent.
    started = time.monotonic()
    async with b.hold("k"):
        assert time.monotonic() - started < 2.0 + 1.5
    async with a.hold("k"):  # A carries on under a new owner id
        pass


async def test_leases_are_on_for_mongodb_or_when_asked(store: Store) -> None:
    auto = leases_for(store, LeaseSettings())
    assert isinstance(auto, AgentLeases) == isinstance(store, MongoStore)
    assert isinstance(leases_for(store, LeaseSettings(mode="on")), AgentLeases)
    assert isinstance(leases_for(store, LeaseSettings(mode="off")), NoLeases)


async def test_live_owners_are_those_whose_heartbeat_has_not_expired(store: Store, twin: Store) -> None:
    await store.lease_register("short", 0.3)
    await store.lease_register("long", 30)
    assert await twin.lease_live({"short", "long", "never-registered"}) == {"short", "long"}

    async def only_long() -> bool:
        return await twin.lease_live({"short", "long"}) == {"long"}

    await eventually(only_long)  # "short" stopped renewing
    assert await store.lease_live(set()) == set()


# -- the inbox on top: whose a waiting row is ---------------------------------------------
async def test_a_waiting_event_is_replayed_by_its_owner_or_once_it_died_by_one_other(
    store: Store, twin: Store, processes: list[AgentLeases]
) -> None:
    """A row waiting for storage is replayed by the process that received it
    while it lives; a process that claimed another live one's row and then died
    would leave it pending under that live owner, never taken over (lost)."""
    a, b = processes
    inbox_a, inbox_b = Inbox(store, leases=a), Inbox(twin, leases=b)
    for event_id in ("Ev1", "Ev2"):
        assert await inbox_a.receive("slack", event_id, "T1:U1", {"text": event_id})
        assert await store.inbox_update(event_id, state="waiting", next_try_at=0.0)

    assert await inbox_b.due("slack") == []  # A lives: its rows are its own to replay
    assert [redo.event_id for redo in await inbox_a.due("slack")] == ["Ev1", "Ev2"]
    assert await inbox_b.due("slack") == []  # claimed once

    # A's rows wait again, and A dies (stops renewing): B takes them over, as its own.
    for event_id in ("Ev1", "Ev2"):
        assert await store.inbox_update(event_id, state="waiting", next_try_at=0.0)
    dead = await a.owner()
    await a.close()

    taken: list[str] = []

    async def b_took_them() -> bool:
        taken.extend(redo.event_id for redo in await inbox_b.due("slack"))
        return len(taken) == 2

    await eventually(b_took_them)
    assert taken == ["Ev1", "Ev2"]
    mine = await b.owner()
    for event_id in taken:
        row = await twin.inbox_entry(event_id)
        assert row is not None and (row.owner, row.state) == (mine, "pending") and row.owner != dead
