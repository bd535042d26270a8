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

Which events are suspect comes from the journal rows at start (their restart
count), so it holds across any number of restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager


class Quarantine:
    def __init__(self) -> None:
        self._suspects: set[str] = set()
        self._changed = asyncio.Condition()
        self._running = 0  # events running now, suspect or not
        self._suspects_waiting = 0
        self._suspect_running = False

    def suspect(self, journal_ids: Iterable[str]) -> None:
        self._suspects.update(journal_ids)

    def is_suspect(self, journal_id: str) -> bool:
        return journal_id in self._suspects

    def __len__(self) -> int:
        return len(self._suspects)

    @asynccontextmanager
    async def admit(self, journal_id: str) -> AsyncIterator[None]:
        """Hold a place to run event `journal_id` for the `async with` body."""
        suspect = journal_id in self._suspects
        async with self._changed:
            if suspect:
                self._suspects_waiting += 1
                try:
                    await self._changed.wait_for(lambda: self._running == 0)
                finally:
                    self._suspects_waiting -= 1
                self._suspect_running = True
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
                        self._suspects.discard(journal_id)
                self._changed.notify_all()
