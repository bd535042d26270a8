"""Suspects (events running when the bot last died) run one at a time and
alone; other events run together as before (bot/durable/inbox.py: Quarantine)."""

from __future__ import annotations

import asyncio

from bot.durable.inbox import Quarantine


async def _run(quarantine: Quarantine, inbox_id: str, running: set[str], seen: list[set[str]]) -> None:
    async with quarantine.admit(inbox_id):
        running.add(inbox_id)
        seen.append(set(running))
        await asyncio.sleep(0.01)
        running.discard(inbox_id)


async def test_suspects_run_alone_and_others_together() -> None:
    quarantine = Quarantine()
    quarantine.suspect(["s1", "s2"])
    running: set[str] = set()
    seen: list[set[str]] = []
    await asyncio.gather(*(_run(quarantine, name, running, seen) for name in ("a", "s1", "b", "s2", "c")))
    # Whenever a suspect ran, it ran alone ...
    assert all(snapshot == {name} for snapshot in seen for name in snapshot if name.startswith("s"))
    # ... while the ordinary events ran together.
    assert any(len(snapshot) > 1 for snapshot in seen)
    # Finished suspects are ordinary again.
    assert not quarantine.is_suspect("s1") and len(quarantine) == 0


async def test_a_suspect_that_fails_stays_suspect() -> None:
    quarantine = Quarantine()
    quarantine.suspect(["s1"])
    try:
        async with quarantine.admit("s1"):
            raise RuntimeError("store down")
    except RuntimeError:
        pass
    assert quarantine.is_suspect("s1")
    async with quarantine.admit("a"):  # and holds nobody up once it left
        pass
