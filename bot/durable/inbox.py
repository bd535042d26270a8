"""The inbox: the inbox's side of the durable-event pipeline
(bot/durable/__init__.py tells the whole protocol).

An entry's life is in its inbox row: pending (received) -> running (work
started) -> done; or, when storage failed the work, running -> waiting (with
its next try) -> pending (claimed for a replay) -> running -> done.

Whose it is. With several processes on one database a row names its *owner*,
the process that received it (its inbox heartbeat, bot/durable/leases.py).
No process replays a row whose owner lives: at start (`leftovers`) and every
few seconds after (`orphans`) a process takes over only the rows of owners
that died, each row by one process (Store.inbox_claim); a row waiting for
storage is replayed (`due`) by its owner, or, the owner dead, claimed likewise.

Evidence against an event. A row found *running* when its process died makes
the event a suspect: it runs again alone (`Quarantine`, below), marked `alone` in
its row from then until its steps are through (so the mark outlives kills
that land before its run, whichever process takes it over). Only a death while it ran alone, before its
steps were through, counts against it (`attempts`); at MAX_RESTARTS such
deaths it is given up. An event that had not started, or ran beside others,
or was being delivered, is not blamed, however slow the machine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from bot.durable.leases import Leases, NoLeases
from bot.events import Event, Redo, agent_key
from bot.sanitize import fix_surrogates_in
from memory.store import InboxEntry, Store, StoreError
from memory.types import utc_now

log = logging.getLogger(__name__)

# Deaths while an event ran alone before it is given up (after the first death
# in company that made it a suspect: at most MAX_RESTARTS + 1 deaths in all).
# An event that stops the bot every time must not keep it from ever getting on.
MAX_RESTARTS = 4
# A waiting event (storage failed it) is replayed this many seconds after it
# gave up, or as soon as storage answers another event.
REPLAY_AFTER = 60.0
# Replays in a run stop this long after the event arrived (storage down for
# hours, or an event whose every write fails, must not hold its user's line
# forever); it then stays unfinished for the next start.
REPLAY_FOR = 3_000.0
GAVE_UP = (
    "I could not process your message: I stopped working every time I tried to answer it, "
    "so I have set it aside. Please send it again, perhaps in other words."
)


@dataclass(slots=True)
class _Unwritten:
    """A row change storage refused (it is down): written at the next round."""

    platform: str
    state: str
    next_try_at: float


class Inbox:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], float] = time.time,
        replay_after: float = REPLAY_AFTER,
        leases: Leases | None = None,
    ) -> None:
        self.store = store
        # Who owns the rows this process receives, and which owners live (several processes).
        self.leases = leases or NoLeases()
        self.clock = clock
        self.replay_after = replay_after
        # Waiting marks storage refused when they were made: they cannot live
        # in the row yet. Written by the next `due` round (then the row rules).
        self._unwritten: dict[str, _Unwritten] = {}
        # Origins with events waiting in this run that storage answered since:
        # their next `due` round replays them without waiting for their time.
        self._waiting: set[str] = set()
        self._answered: set[str] = set()
        # Events running when the process died run one at a time, alone (`Quarantine`, below).
        self.quarantine = Quarantine()
        # Replayed entries that were debounced into another (InboxEntry.absorbed_into).
        self._absorbed: set[str] = set()

    # -- the adapters' side (through the bot's port) --------------------------
    async def receive(self, platform: str, event_id: str, user_id: str, payload: dict[str, Any]) -> bool:
        """Record an inbound event; False for a repeat delivery. Raises
        StoreError when it cannot be recorded: the adapter must then not
        acknowledge it (the platform delivers it again)."""
        # A payload may spell lone surrogates ("\ud800" in Slack's JSON): no store can hold those.
        entry = InboxEntry(event_id, platform, agent_key(platform, user_id), fix_surrogates_in(payload), utc_now())
        entry.owner = await self.leases.owner()
        return await self.store.inbox_receive(entry)

    async def finished(self, event_id: str) -> None:
        """Every reply was sent or handed to the retrier: done, unless it waits for a replay."""
        if event_id in self._unwritten:
            return
        try:
            await self.store.inbox_update(event_id, state="done", only_from=("pending", "running"))
        except StoreError as error:
            # The replies are out; at worst a restart replays it and finds them sent.
            log.warning("could not mark event %s done (%s); a restart will re-check it", event_id, error)

    async def leftovers(self, platform: str) -> list[Redo]:
        """At start: every event the last run (or another process that died)
        left unfinished, in arrival order, taken over. One found running is a
        suspect; one found running alone counts a death against it, and at
        MAX_RESTARTS it is given up (Redo.notice: the adapter tells the
        person, then finishes it). Rows of live processes are theirs."""
        return await self._take_over(platform, at_start=True)

    async def orphans(self, platform: str) -> list[Redo]:
        """Every few seconds, with several processes: the unfinished rows of
        processes that died since (their owner expired), taken over as at
        start; a process scaled away for good loses nothing. Rows waiting for
        storage are left to `due`."""
        if isinstance(self.leases, NoLeases):
            return []  # one process: nobody else's rows to take
        return await self._take_over(platform, at_start=False)

    async def _take_over(self, platform: str, *, at_start: bool) -> list[Redo]:
        entries = await self.store.inbox_pending(platform)
        if not at_start:
            entries = [e for e in entries if e.state != "waiting" and not self.leases.mine(e.owner)]
        redos = [await self._redo_taken(platform, entry) for entry in await self._claim(entries)]
        if redos:
            whose = "the last run" if at_start else "processes that stopped"
            log.info("%s: replaying %d events left unfinished by %s", platform, len(redos), whose)
        if redos and len(self.quarantine):
            log.info(
                "%s: %d of them may have stopped the bot: they run one at a time, alone", platform, len(self.quarantine)
            )
        return redos

    async def _claim(self, entries: list[InboxEntry], *, with_mine: bool = False) -> list[InboxEntry]:
        """The entries this process may work on, each made its own: none a live
        process holds (another one's, or at start one that just arrived here;
        with_mine: this process's own lives are not in the way); one of a dead
        owner or of an earlier life is claimed (inbox_claim: one claimer wins)."""
        live = await self.leases.live({entry.owner for entry in entries if entry.owner})
        me = await self.leases.owner()
        taken = []
        for entry in entries:
            if entry.owner in live and not (with_mine and self.leases.mine(entry.owner)):
                continue
            if entry.owner != me and not await self.store.inbox_claim(entry.event_id, entry.owner, me):
                continue  # another process took it over first
            entry.owner = me
            taken.append(entry)
        return taken

    async def _redo_taken(self, platform: str, entry: InboxEntry) -> Redo:
        running = entry.state == "running"
        stops = entry.attempts + (running and entry.alone)
        # A suspect stays one, in its row, until it ran alone: a kill before
        # its run (a start-up, a wait in line) must not clear the suspicion,
        # or its next death, in company again, would count for nothing.
        entry.alone = (running or stops > 0 or entry.alone) and stops < MAX_RESTARTS
        redo = self._redo(entry)
        if stops >= MAX_RESTARTS:
            log.error(
                "giving up on %s event %s of %s: the bot stopped %d times while it ran alone",
                platform,
                entry.event_id,
                entry.agent_key,
                stops,
            )
            redo.notice = GAVE_UP
        if entry.state != "pending" or stops != entry.attempts or running:
            await self.store.inbox_update(
                entry.event_id, state="pending", attempts=stops, next_try_at=0.0, alone=entry.alone
            )
        return redo

    def _redo(self, entry: InboxEntry) -> Redo:
        if entry.absorbed_into:
            self._absorbed.add(entry.event_id)
        if entry.alone:  # a suspect (marked in its row): it runs alone
            self.quarantine.suspect([entry.event_id])
        return Redo(entry.event_id, entry.payload)

    # -- the runtime's side ----------------------------------------------------
    async def started(self, event: Event) -> None:
        """Work on `event` starts: its entry is running (a waiting one stays
        waiting), and the entries debounced into it name it, before any of
        their messages is recorded (bot/durable/debounce.py)."""
        if event.in_inbox:
            # A suspect keeps its mark while it runs alone: a death now is evidence against it.
            alone = self.quarantine.is_suspect(event.inbox_id)
            event.first_run = await self.store.inbox_start(event.inbox_id, alone=alone)
            followers = [member.inbox_id for member in event.members()[1:]]
            if followers:
                await self.store.inbox_absorb(event.inbox_id, followers)

    async def ran(self, event: Event) -> None:
        """The steps of a suspect went through: a death from here on (while
        its replies are delivered) is no evidence against it."""
        if event.in_inbox and self.quarantine.is_suspect(event.inbox_id):
            await self.store.inbox_update(event.inbox_id, alone=False)

    async def answered_with_its_batch(self, agent_id: str, event: Event) -> bool:
        """A replayed event that was debounced into another, and whose message
        that batch recorded: the batch's run answers it (or did), so it gets no
        answer of its own. One whose batch stopped before recording is not."""
        if event.inbox_id not in self._absorbed:
            return False
        recorded = await self.store.event_message_seq(agent_id, event.event_id) is not None
        self._absorbed.discard(event.inbox_id)
        if not recorded:
            # An event of its own from here: unlinked before its run records its message, so
            # if that run dies before answering, the next replay does not read the message as
            # recorded by the batch (it was finished unanswered: a SIGKILL test under load).
            await self.store.inbox_absorb("", [event.inbox_id])
            return False
        log.info("event %s was answered with the batch it was debounced into", event.inbox_id)
        return True

    async def wait_for_storage(self, event: Event) -> None:
        """Storage stayed down for the whole wait: the entry waits for a replay
        (REPLAY_AFTER from now, or once storage answers), or, REPLAY_FOR after
        it arrived, for the next start. So do the events debounced into it."""
        for member in event.members():
            await self._wait_for_storage(member)

    async def _wait_for_storage(self, event: Event) -> None:
        now = self.clock()
        if now - event.created_at.timestamp() > REPLAY_FOR:
            log.error(
                "event %s waited for storage for over %.0f s; left unfinished for the next start",
                event.inbox_id,
                REPLAY_FOR,
            )
            change = _Unwritten(event.platform, "pending", 0.0)
        else:
            log.warning(
                "event %s waits for storage; replayed in %.0f s, or once storage answers",
                event.inbox_id,
                self.replay_after,
            )
            change = _Unwritten(event.platform, "waiting", now + self.replay_after)
            self._waiting.add(event.platform)
        if not await self._write(event.inbox_id, change):
            self._unwritten[event.inbox_id] = change

    def storage_answered(self) -> None:
        """An event got through the store: waiting entries are due now."""
        self._answered |= self._waiting

    async def due(self, platform: str) -> list[Redo]:
        """Waiting entries of `platform` whose replay is due, claimed for it (in arrival order)."""
        for event_id, change in list(self._unwritten.items()):
            if change.state == "waiting":  # its wait starts once it is written
                change.next_try_at = self.clock() + self.replay_after
            if change.platform == platform and await self._write(event_id, change):
                del self._unwritten[event_id]
        answered = platform in self._answered
        entries = await self.store.inbox_pending(platform, due_by=float("inf") if answered else self.clock())
        self._answered.discard(platform)
        redos = []
        # Only the owner replays a waiting row: a process that replayed another
        # live one's row and died would leave it pending under a live owner,
        # which takes over only the rows of the dead (never replayed: lost).
        for entry in await self._claim(entries, with_mine=True):
            # Pending again, so `started` can take it (only one claimer wins).
            if await self.store.inbox_update(entry.event_id, state="pending", next_try_at=0.0, only_from=("waiting",)):
                redos.append(self._redo(entry))
        if redos:
            log.info("%s: replaying %d events that waited for storage", platform, len(redos))
        return redos

    async def _write(self, event_id: str, change: _Unwritten) -> bool:
        try:
            await self.store.inbox_update(
                event_id, state=change.state, next_try_at=change.next_try_at, only_from=("pending", "running")
            )
        except StoreError as error:
            log.info("event %s: cannot write that it waits yet (%s); will try again", event_id, error)
            return False
        return True


class Quarantine:
    """After a crash, the events that were running when the process died are
    suspects: one of them may be what killed it (a poison event), the others were
    only in the way. Run together again, a poison event would take them down with
    it at every restart, and each would be blamed for it in turn.

    So suspects run one at a time, and alone: a suspect waits until no other
    event is running, and no event starts while a suspect runs or waits. A death
    during a suspect's run then counts against that one event (Inbox.leftovers),
    and a poison event is given up after MAX_RESTARTS deaths of its own, while
    the innocent ones, each run alone, simply finish. Once a suspect finishes,
    it is an ordinary event again; everything else runs concurrently as before.

    Which events are suspect comes from the inbox rows at start (their restart
    count), so it holds across any number of restarts."""

    def __init__(self) -> None:
        self._suspects: set[str] = set()
        self._changed = asyncio.Condition()
        self._running = 0  # events running now, suspect or not
        self._suspects_waiting = 0
        self._suspect_running = False

    def suspect(self, inbox_ids: Iterable[str]) -> None:
        self._suspects.update(inbox_ids)

    def is_suspect(self, inbox_id: str) -> bool:
        return inbox_id in self._suspects

    def __len__(self) -> int:
        return len(self._suspects)

    @asynccontextmanager
    async def admit(self, inbox_id: str) -> AsyncIterator[None]:
        """Hold a place to run event `inbox_id` for the `async with` body."""
        suspect = inbox_id in self._suspects
        async with self._changed:
            if suspect:
                self._suspects_waiting += 1
                try:
                    await self._changed.wait_for(lambda: self._running == 0)
                finally:
                    self._suspects_waiting -= 1
                self._suspect_running = True
                log.debug("running suspect event %s alone", inbox_id)
            else:
                await self._changed.wait_for(lambda: not self._suspect_running and not self._suspects_waiting)
            self._running += 1
        finished = False
        try:
            yield
            finished = True
        finally:
            async with self._changed:
                self._running -= 1
                if suspect:
                    self._suspect_running = False
                    if finished:
                        self._suspects.discard(inbox_id)
                self._changed.notify_all()
