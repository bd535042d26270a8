"""MongoStore's share of coordinating several bot processes on one database:
the LeaseStore role (memory/roles.py), as a mixin of MongoStore.

    lease_owners      {_id: owner (a bot process), expires_at}
    lease_tickets     {_id: ObjectId, name, seq, owner, done}      unique (name, seq)

The only write that every MongoDB-compatible server makes atomic is an insert
against a unique index (FerretDB runs update and findAndModify as a read, then
a write), so that is what arbitrates: the unique (name, seq) for a ticket in an
agent's line (and, in memory/mongo/inbox.py, the event id for repeat deliveries). Every other write here
has one writer (an owner's heartbeat, a ticket's owner, the lease holder) or
is a clean-up that is safe to lose or to repeat. The lease protocol, and why
these rules make it safe, is told in bot/durable/leases.py.

Times (expires_at) are the *server's* clock, in float seconds: each process
measures the server's clock (`hello`.localTime) against its own monotonic
clock and refreshes that every few minutes, so processes on machines whose
clocks disagree (or get stepped) still agree on when an owner expires, to
within the round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from datetime import UTC, datetime

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from memory.mongo.base import MAX_ATTEMPTS, Doc, MongoBase
from memory.mongo.capabilities import guarded
from memory.sqlite.coordination import CLEAR_EVERY, position
from memory.store import StoreError

log = logging.getLogger("memory.mongo.store")

COORDINATION_INDEXES: dict[str, list[IndexModel]] = {
    "lease_tickets": [IndexModel([("name", ASCENDING), ("seq", ASCENDING)], unique=True, name="name_seq_unique")],
}
_CLOCK_REFRESH = 600.0  # seconds between measurements of the server's clock
_MAX_OWNERS_SEEN = 1_000  # remembered owner expiries, before the expired ones are dropped
_MAX_TICKETS_DRAWN = 10_000  # remembered last tickets, before they are all forgotten


def _seconds(moment: datetime) -> float:
    if moment.tzinfo is None:  # PyMongo hands out naive UTC unless tz_aware
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


class MongoCoordination(MongoBase):
    # Per-process state, set on first use (MongoBase.__init__ knows nothing of it).
    # The server's clock minus time.monotonic() here: monotonic, because the
    # wall clock of this machine may be wrong or be stepped (NTP) meanwhile.
    _clock_offset: float | None = None
    _clock_measured = 0.0  # time.monotonic() of the last measurement
    _owners_seen: dict[str, float]  # owner -> expires_at last read (server clock)
    _tickets_drawn: dict[str, int]  # name -> the last ticket this process drew in its line
    # name -> (a ticket just drawn, the line before it as read then): lease_position's first read
    _lines_read: dict[str, tuple[int, list[tuple[int, str, object]]]]

    async def _prepare_coordination(self, db: AsyncDatabase[Doc]) -> None:
        """At open(): this process's view of the other lease owners, and of the
        lines, starts empty."""
        self._owners_seen = {}
        self._tickets_drawn = {}
        self._lines_read = {}

    async def _store_clock(self) -> float:
        """The store's clock (the server's), as float seconds since the epoch."""
        if self._clock_offset is None or time.monotonic() - self._clock_measured > _CLOCK_REFRESH:
            if self._db is None:
                raise StoreError(f"MongoDB store {self.redacted_uri} is not open")
            before = time.monotonic()
            hello = await self._db.command("hello")
            after = time.monotonic()
            server = hello.get("localTime")
            # The server read its clock about halfway through the round trip.
            # (A server that does not say: this machine's clock, the best we have.)
            now = _seconds(server) if isinstance(server, datetime) else time.time()
            self._clock_offset = now - (before + after) / 2
            self._clock_measured = after
        return time.monotonic() + self._clock_offset

    # -- agent leases --------------------------------------------------------
    @guarded
    async def lease_register(self, owner: str, ttl: float) -> None:
        owners = self._c("lease_owners")
        now = await self._store_clock()
        # Owners dead for a while go (a missing owner counts as dead).
        await owners.delete_many({"expires_at": {"$lt": now - ttl}})
        await owners.insert_one({"_id": owner, "expires_at": now + ttl})

    @guarded
    async def lease_renew(self, owner: str, ttl: float) -> bool:
        now = await self._store_clock()
        # An expired owner is never renewed: others may already have passed its tickets.
        renewed = await self._c("lease_owners").update_one(
            {"_id": owner, "expires_at": {"$gte": now}}, {"$set": {"expires_at": now + ttl}}
        )
        return bool(renewed.matched_count)

    @guarded
    async def lease_join(self, name: str, owner: str) -> int:
        tickets = self._c("lease_tickets")
        # An agent's events mostly come to the process that had its last one:
        # then the number after our last ticket is the next one, and reading
        # the line's highest first would only say so. A wrong guess costs a
        # try: a number taken is a duplicate key, one cleared away is caught
        # by the check below, as any race is.
        drawn = self._tickets_drawn.pop(name, None)
        for attempt in range(MAX_ATTEMPTS):
            if drawn is not None:
                seq, drawn = drawn + 1, None
            else:
                last = await tickets.find_one({"name": name}, {"seq": 1}, sort=[("seq", DESCENDING)])
                seq = (int(last["seq"]) if last else 0) + 1
            ticket = {"name": name, "seq": seq, "owner": owner, "done": False}
            try:
                await tickets.insert_one(ticket)
            except DuplicateKeyError:  # another process took that number first
                await self._backoff(attempt)
                continue
            # The number was free, but was it *new*? It could be one handed out
            # and cleared away between our read and our insert; clean-up keeps
            # each name's highest ticket, so a higher one exists then. (So does
            # one drawn right after ours: we give ours up and draw again too.)
            # The same read takes the line up to ours, for the first lease_position:
            # a read made after our insert, as that one's would be.
            line = await self._line(name, {"$or": [{"seq": {"$gt": seq}}, {"seq": {"$lte": seq}, "done": False}]})
            if not line or line[0][0] <= seq:
                if len(self._tickets_drawn) >= _MAX_TICKETS_DRAWN:
                    self._tickets_drawn.clear()
                    self._lines_read.clear()
                self._tickets_drawn[name] = seq
                self._lines_read[name] = (seq, line)
                return seq
            await tickets.update_one({"_id": ticket["_id"]}, {"$set": {"done": True}})
            await self._backoff(attempt)
        raise StoreError(f"MongoDB store: gave up joining the line for {name!r} after {MAX_ATTEMPTS} races")

    async def _line(self, name: str, where: Doc) -> list[tuple[int, str, object]]:
        """The tickets of `name`'s line that `where` picks, highest first: (seq, owner, _id)."""
        cursor = self._c("lease_tickets").find({"name": name, **where}, {"seq": 1, "owner": 1})
        return [(int(doc["seq"]), str(doc["owner"]), doc["_id"]) async for doc in cursor.sort("seq", DESCENDING)]

    @guarded
    async def lease_position(self, name: str, seq: int, owner: str) -> int | None:
        drawn, read = self._lines_read.pop(name, (0, []))
        # The line as lease_join read it is enough to say nobody is ahead (no one
        # can come ahead later); else it is read again: those ahead may be done now.
        if drawn == seq and await self._place_in(read, seq, owner) == 0:
            return 0
        return await self._place_in(await self._line(name, {"seq": {"$lte": seq}, "done": False}), seq, owner)

    async def _place_in(self, ahead: list[tuple[int, str, object]], seq: int, owner: str) -> int | None:
        """lease_position from the line's tickets up to ours that are not done, highest first."""
        now = await self._store_clock()
        live = await self._live_owners({other for _, other, _ in ahead}, now)
        found = position([(n, other) for n, other, _ in ahead], seq, owner, live)
        dead = [ticket_id for n, other, ticket_id in ahead[1:] if other not in live]
        if found is not None and dead:
            # Their owners can never come back, and ours is higher, so none of
            # them is the name's highest ticket: they can go.
            await self._c("lease_tickets").delete_many({"_id": {"$in": dead}})
        return found

    @guarded
    async def lease_live(self, owners: Collection[str]) -> set[str]:
        return await self._live_owners(set(owners), await self._store_clock())

    async def _live_owners(self, owners: set[str], now: float) -> set[str]:
        # An owner seen alive until E is alive until E for sure (expires_at
        # only grows): waiters polling the same line skip re-reading it.
        known = self._owners_seen
        unsure = [owner for owner in owners if known.get(owner, 0.0) < now]
        if unsure:
            async for doc in self._c("lease_owners").find({"_id": {"$in": unsure}}, {"expires_at": 1}):
                known[doc["_id"]] = float(doc["expires_at"])
            if len(known) > _MAX_OWNERS_SEEN:
                self._owners_seen = known = {owner: until for owner, until in known.items() if until >= now}
        return {owner for owner in owners if known.get(owner, 0.0) >= now}

    @guarded
    async def lease_leave(self, name: str, seq: int, owner: str) -> None:
        tickets = self._c("lease_tickets")
        await tickets.update_one({"name": name, "seq": seq, "owner": owner}, {"$set": {"done": True}})
        if seq % CLEAR_EVERY:
            return
        # Done tickets go, except the highest: numbers only ever grow, which
        # is what lets lease_join spot a number handed out twice.
        highest = await tickets.find_one({"name": name}, {"seq": 1}, sort=[("seq", DESCENDING)])
        if highest is not None:
            await tickets.delete_many({"name": name, "seq": {"$lt": highest["seq"]}, "done": True})
