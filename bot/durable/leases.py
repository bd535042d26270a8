"""Agent leases: with several bot processes on one database, one agent is
worked on by one process at a time, and its events run in the order they
arrived, whichever process they arrived at.

The protocol (store side: `Store.lease_*`, in memory/mongo/coordination.py
and memory/sqlite/coordination.py):

1. OWNER. A process taking part registers an *owner* id with a heartbeat
   (expires_at, on the store's clock), renewed every
   MEMGPT_LEASE_RENEW seconds; it dies MEMGPT_LEASE_TTL seconds after the
   last renewal and can never be renewed after that (the process then starts
   over under a new owner id).
2. JOIN. An event takes the next *ticket* in its agent's line: read the
   highest number, insert number + 1 with its owner. A unique (key, seq)
   index makes the insert the arbiter: of two processes drawing one number,
   one gets a duplicate key and draws again. Inside a process the tickets of
   one agent are drawn one at a time, in the order `hold` was called.
3. WAIT. The lowest *live* ticket (not done, owner alive) holds the lease.
   Of one process's events for an agent only the first polls (reads only,
   with a back-off that grows with its place in line); the others queue
   behind it in memory. They give up after MEMGPT_LEASE_WAIT
   (LeaseTimeoutError, nothing done).
4. HOLD. Nothing is written. If this process's previous turn on the agent
   ended well and held the ticket just before this one (numbers only grow, see
   below: nobody can have held a number in between, nor a lower one since),
   nobody else worked on the agent since: the Turn says `continuous=True`.
   Otherwise (another process's ticket came between, this process's last
   turn failed, or it has none) another process may have: `continuous=False`,
   and the runtime reloads the agent from the store rather than trust its
   cached copy.
5. LEAVE. The ticket is marked done; the next one in line holds the lease.
   A crashed process stops renewing its heartbeat, so within the ttl all its
   tickets are dead and the line moves on. The crashed event's user message
   may already be in recall storage; its reply is never sent.

Why this is safe where only an insert against a unique index is atomic
(FerretDB runs update and findAndModify as a read, then a write):

- Only inserts arbitrate. Every update has one writer: an owner renews its
  own heartbeat and marks its own tickets done.
- Expiry is judged on one clock: MongoDB's server clock (each process
  measures it against its own monotonic clock, so bot machines need not
  agree on the time, and a stepped wall clock changes nothing), or for
  SQLite the machine's monotonic clock. A process counts its owner alive
  only until (send time of its last successful renewal) + 0.8 ttl on its
  own monotonic clock, and a renewal counts only if it completed before
  that deadline. At the deadline it cancels the work of
  every lease it holds (LeaseLostError) and fails its waiting events: by the
  time any other process can see the owner expired, it has stopped. What
  must hold is that a process is not frozen for over 0.2 ttl between looking
  at its deadline and writing, hence generous defaults: ttl 30 s, renewed
  every 5 s (a renewal without an answer in 5 s is abandoned and sent again),
  so a database that stalls for up to ~19 s costs no lease. An expired
  owner is never renewed again (the renewal's filter requires expires_at >= now).
- Numbers handed out twice: a joiner reads the highest number, then inserts.
  Had the ticket with the next number been taken and *deleted* in between,
  the insert would succeed below a live ticket that may already hold the
  lease: two holders. So clean-up never deletes a name's highest ticket
  (numbers only grow), and a joiner that finds a higher ticket right after
  its insert gives its number up (marks it done) and draws again. So a
  ticket that gets its turn is numbered above every ticket drawn before it,
  and the one numbered just below it is the last that could have held the
  lease before it (HOLD's test).

With a single process (SQLite, the default) the lease is a no-op (NoLeases);
MEMGPT_LEASES=on turns it on for SQLite too (several processes on one file).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from bot.durable.lanes import Lanes
from bot.settings import LeaseSettings
from memory.roles import LeaseStore
from memory.store import Store, StoreError

log = logging.getLogger(__name__)

VALID_FOR = 0.8  # of ttl after a renewal was sent: how long a process counts on its heartbeat
POLL_FIRST = 0.01  # seconds between a waiter's polls, growing 1.5x...
POLL_MAX = 0.25  # ...up to this, times the number of tickets ahead...
POLL_FAR = 1.0  # ...up to this


class LeaseLostError(StoreError):
    """This process's heartbeat ran out (it was cut off from the database, or
    stalled) while it held or waited for a lease: the work was stopped."""


class LeaseTimeoutError(StoreError):
    """Another process kept the agent busy for longer than MEMGPT_LEASE_WAIT."""


@dataclass(frozen=True, slots=True)
class Turn:
    key: str
    # This process held the agent last and its turn ended well: a copy of the
    # agent cached since then is current. False: reload it from the store.
    continuous: bool


class Leases(Protocol):
    def hold(self, key: str) -> contextlib.AbstractAsyncContextManager[Turn]:
        """Wait for the agent's turn and hold it for the `async with` body."""
        ...

    async def owner(self) -> str:
        """This process's live owner id, which inbox entries it receives or
        takes over are marked with (bot/durable/inbox.py)."""
        ...

    def mine(self, owner: str) -> bool:
        """Whether `owner` is one of this process's owner ids (any of its lives)."""
        ...

    async def live(self, owners: Collection[str]) -> set[str]:
        """Those of `owners` that are alive (another process may hold their entries)."""
        ...

    async def close(self) -> None: ...


class NoLeases:
    """One bot process on the database: the runtime's own lock is enough."""

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[Turn]:
        yield Turn(key, continuous=True)

    async def owner(self) -> str:
        return ""

    def mine(self, owner: str) -> bool:
        return True  # the only process there is

    async def live(self, owners: Collection[str]) -> set[str]:
        return set()  # at start, whatever the last run held is nobody's

    async def close(self) -> None:
        pass


def leases_for(store: Store, settings: LeaseSettings | None = None) -> Leases:
    """AgentLeases when MEMGPT_LEASES says so, or (auto) when the store is
    MongoDB, the backend meant for several processes; else NoLeases."""
    settings = settings or LeaseSettings()
    enabled = store.serves_many_processes if settings.mode == "auto" else settings.mode == "on"
    return AgentLeases(store, settings) if enabled else NoLeases()


def lease_name(key: str) -> str:
    """What an agent's lease rows are stored under: a digest of its key. A
    name's highest ticket is never deleted (see above), so its rows outlive a
    forgotten user; they must not hold the user's id."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(eq=False)
class _Heartbeat:
    """One life of this process as a lease owner."""

    owner: str
    deadline: float  # time.monotonic() until which the owner surely lives
    lost: bool = False
    # Retired after a failed join or leave left a ticket whose state we do not
    # know: new events take a new owner, and this one is let die once its
    # events are through, taking that ticket with it.
    retired: bool = False
    active: int = 0  # hold() calls using this owner, from join to leave
    holders: set[asyncio.Task[object]] = field(default_factory=set)  # tasks in a lease body
    beating: asyncio.Task[None] | None = None
    # Set to end the heartbeat between two renewals. The task is never
    # cancelled in the middle of a store call: on Python 3.11 cancelling
    # PyMongo's async client mid-operation can break its connection lock and
    # hang every later call on that client.
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class AgentLeases:
    def __init__(self, store: LeaseStore, settings: LeaseSettings | None = None, *, name: str | None = None) -> None:
        self.store = store
        self.settings = settings or LeaseSettings()
        self.name = name or process_name()  # owner ids are NAME/1, NAME/2...
        # Called as on_join(key, seq) in the joining task once a ticket is
        # taken: the event has its place in line (for tests and metrics).
        self.on_join: Callable[[str, int], None] | None = None
        self._heart: _Heartbeat | None = None
        self._inbox_heart: _Heartbeat | None = None  # the owner of inbox entries (owner())
        self._lives = 0
        self._beats: set[asyncio.Task[None]] = set()  # heartbeats still renewed (a retired one until its events end)
        self._heart_lock = asyncio.Lock()
        self._joins = Lanes()  # one ticket drawn at a time per agent
        self._turns = Lanes()  # one event of this process per agent goes on
        self._last: dict[str, int] = {}  # key -> the ticket of this process's last turn on it, if it ended well

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[Turn]:
        heart, seq = await self._join(key)
        ok = left = False
        try:
            # One event of this process per agent goes on (in line order): the
            # others wait here for it, not polling the database.
            async with self._turns.hold(key):
                try:
                    await self._wait_turn(key, seq, heart)
                    continuous = self._last.pop(key, None) == seq - 1  # see HOLD above
                    task = asyncio.current_task()
                    assert task is not None
                    self._check(heart, key)
                    heart.holders.add(task)
                    try:
                        yield Turn(key, continuous)
                    except asyncio.CancelledError:
                        if heart.lost and task.uncancel() == 0:  # our cancellation, nobody else's
                            raise LeaseLostError(f"lost the lease on {key} while working on it") from None
                        raise
                    finally:
                        heart.holders.discard(task)
                    ok = True
                finally:
                    if ok:
                        self._last[key] = seq
                    left = True  # leave before the next local event polls, so it finds us gone
                    await self._leave(key, seq, heart)
        finally:
            if not left:  # cancelled while waiting for the local turn
                await self._leave(key, seq, heart)

    async def owner(self) -> str:
        # A heartbeat of its own, never retired: an agent lease's owner is let
        # die after a failed join or leave, while the entries it was handed
        # may still wait in this process (in a debounce window, in a lane).
        async with self._heart_lock:
            heart = self._inbox_heart
            if heart is None or heart.lost:
                heart = self._inbox_heart = await self._start_heartbeat("inbox-")
            return heart.owner

    def mine(self, owner: str) -> bool:
        return owner.startswith(f"{self.name}/")

    async def live(self, owners: Collection[str]) -> set[str]:
        return await self.store.lease_live(owners) if owners else set()

    async def close(self) -> None:
        """Stop renewing (the process's tickets die with its heartbeat)."""
        for heart in (self._heart, self._inbox_heart):
            if heart is not None:
                heart.stop.set()
        self._heart = self._inbox_heart = None
        beats, self._beats = list(self._beats), set()
        # Each stops at its next wake; one stuck in a renewal is waited for a moment, then cancelled.
        _, stuck = await asyncio.wait(beats, timeout=2.0) if beats else (set(), set())
        for beat in stuck:
            beat.cancel()
        await asyncio.gather(*beats, return_exceptions=True)

    # -- the heartbeat -------------------------------------------------------
    async def _alive(self) -> _Heartbeat:
        """The current heartbeat, started (under a new owner id) if there is
        none yet or the last one was lost."""
        async with self._heart_lock:
            heart = self._heart
            if heart is None or heart.lost or heart.retired:
                heart = self._heart = await self._start_heartbeat("")
            return heart

    async def _start_heartbeat(self, kind: str) -> _Heartbeat:
        self._lives += 1
        owner = f"{self.name}/{kind}{self._lives}"
        sent = time.monotonic()
        await self.store.lease_register(owner, self.settings.ttl)
        heart = _Heartbeat(owner, sent + VALID_FOR * self.settings.ttl)
        heart.beating = asyncio.create_task(self._beat(heart), name=f"lease-heartbeat-{owner}")
        self._beats.add(heart.beating)
        heart.beating.add_done_callback(self._beats.discard)
        return heart

    async def _beat(self, heart: _Heartbeat) -> None:
        """Renew the owner until it is lost; on loss, stop every lease body."""
        while True:
            pause = min(self.settings.renew_every, max(heart.deadline - time.monotonic(), 0.0) / 2)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(heart.stop.wait(), timeout=pause)
            if heart.stop.is_set():
                return
            sent = time.monotonic()
            if sent >= heart.deadline:
                self._lose(heart)
                return
            try:
                # Shielded: a renewal that takes too long is abandoned, not
                # cancelled (see stop), and another one is sent: a stalled
                # connection (or server) must not use up the whole deadline
                # when a later attempt could get through. An abandoned one
                # that lands later only keeps the owner alive longer.
                renewed = await asyncio.wait_for(
                    asyncio.shield(self.store.lease_renew(heart.owner, self.settings.ttl)),
                    timeout=min(heart.deadline - sent, self.settings.renew_every),
                )
            except TimeoutError:
                log.warning(
                    "renewing lease owner %s: no answer in %.1f s (the database is stalled); trying again, %.1f s left",
                    heart.owner,
                    time.monotonic() - sent,
                    max(heart.deadline - time.monotonic(), 0.0),
                )
                continue
            except StoreError as error:  # try again, until the deadline
                log.warning("renewing lease owner %s failed: %s", heart.owner, error)
                await asyncio.sleep(min(1.0, max(heart.deadline - time.monotonic(), 0.0) / 4))
                continue
            took = time.monotonic() - sent
            if not renewed or time.monotonic() >= heart.deadline:
                self._lose(heart)
                return
            heart.deadline = sent + VALID_FOR * self.settings.ttl
            if took > self.settings.renew_every:
                log.warning("renewing lease owner %s took %.1f s: the database is slow", heart.owner, took)

    def _retire(self, heart: _Heartbeat) -> None:
        heart.retired = True
        if heart.active == 0:
            heart.stop.set()

    def _lose(self, heart: _Heartbeat) -> None:
        heart.lost = True
        log.error(
            "lease owner %s ran out (cut off from the database, or stalled); stopping %d lease(s)",
            heart.owner,
            len(heart.holders),
        )
        for task in heart.holders:
            task.cancel()

    @staticmethod
    def _check(heart: _Heartbeat, key: str) -> None:
        if heart.lost or time.monotonic() >= heart.deadline:
            raise LeaseLostError(f"lost the lease on {key}: this process's heartbeat ran out")

    # -- a ticket's life -----------------------------------------------------
    async def _join(self, key: str) -> tuple[_Heartbeat, int]:
        # No await before this: tickets are drawn in the order hold() was called
        # (asyncio.Lock is FIFO), and taken into the local turn in that order too.
        async with self._joins.hold(key):
            heart = await self._alive()
            try:
                seq = await self.store.lease_join(lease_name(key), heart.owner)
            except StoreError:
                self._retire(heart)  # a ticket may have been stored for us all the same
                raise
            heart.active += 1
            if self.on_join is not None:
                self.on_join(key, seq)
        return heart, seq

    async def _wait_turn(self, key: str, seq: int, heart: _Heartbeat) -> None:
        started, pause = time.monotonic(), POLL_FIRST
        while True:
            self._check(heart, key)
            ahead = await self.store.lease_position(lease_name(key), seq, heart.owner)
            if ahead is None:
                raise LeaseLostError(f"lost the place in line for {key} (ticket {seq})")
            self._check(heart, key)
            if ahead == 0:
                return
            if time.monotonic() - started > self.settings.max_wait:
                raise LeaseTimeoutError(
                    f"{key} was busy in another bot process for over {self.settings.max_wait:.0f} s"
                )
            # Ahead are other processes' events: the further back, the rarer the polls.
            await asyncio.sleep(min(pause * ahead, POLL_FAR) * random.uniform(0.8, 1.2))
            pause = min(pause * 1.5, POLL_MAX)

    async def _leave(self, key: str, seq: int, heart: _Heartbeat) -> None:
        # Shielded: a cancelled event still gives its place up at once (else
        # the next one would wait for the whole heartbeat to expire).
        await asyncio.shield(self._mark_done(key, seq, heart))

    async def _mark_done(self, key: str, seq: int, heart: _Heartbeat) -> None:
        try:
            await self.store.lease_leave(lease_name(key), seq, heart.owner)
        except StoreError as error:
            log.warning("leaving the line for %s failed (%s); its owner %s is retired", key, error, heart.owner)
            heart.retired = True
        finally:
            heart.active -= 1
            if heart.retired:
                self._retire(heart)
