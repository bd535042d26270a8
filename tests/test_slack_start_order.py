"""At start, a new Slack message that arrives while the last run's events are
read from the inbox is answered after the replays of the same person's
older ones, never before (bot/durable/lanes.py: the start-up gate). The crash
harness saw it otherwise: U9's message 19 answered 0 times, 31 twice."""

from __future__ import annotations

from typing import Any

import pytest

from bot.durable.debounce import Burst
from bot.events import Redo
from tests import test_slack_adapter as slack_tests
from tests.fake_llm import FakeLLMServer, say
from tests.helpers import user_texts
from tests.test_slack_adapter import Start, dm

fake_slack = slack_tests.fake_slack
start_bot = slack_tests.start_bot


def payload(event_id: str, text: str) -> dict[str, Any]:
    origin = {"team": "T1", "user": "U1", "reply_to": {"channel": "DU1"}, "event_id": event_id}
    return {"kind": "message", "event": dm(text), "origin": origin | {"created_at": "2026-11-30T10:00:00+00:00"}}


async def test_a_new_message_arriving_with_the_journal_read_waits_for_the_replays(
    start_bot: Start, llm_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    bot = await start_bot()
    adapter = bot.adapter
    adapter.hold_new_events()  # as `memgpt-bot run` does before the adapters start
    # The last run left "number 1" unfinished.
    await bot.runtime.receive("slack", "EvOld", "T1:U1", payload("EvOld", "number 1"))
    new = payload("EvNew", "number 2")
    read_the_journal = bot.runtime.leftovers

    async def a_new_message_comes_with_the_read(origin: str) -> list[Redo]:
        # "number 2" is recorded in the inbox just before the read, and its listener goes
        # on in the same turn as recover(): its task exists, not yet run,
        # when the replays' tasks are created and the gate is released.
        await bot.runtime.receive("slack", "EvNew", "T1:U1", new)
        redos = await read_the_journal(origin)
        # Its work starts as a listener's does once the inbox has it (Pipeline.take).
        arrival = adapter.arrival_of(new)
        arrival.recorded.set()
        adapter.pipeline._start(Burst([arrival], 0.0, 0.0, closed=True))
        return redos

    monkeypatch.setattr(bot.runtime, "leftovers", a_new_message_comes_with_the_read)
    llm_server.set_handler(lambda request: say("ok " + user_texts(request)[-1].rsplit(" ", 1)[-1]))
    assert await adapter.recover() == 2  # both are in the inbox's leftovers
    assert await bot.texts(2) == ["ok 1", "ok 2"]  # before the fix: ["ok 2", "ok 1"]
    record = await bot.runtime.store.find_agent("slack:T1:U1")
    assert record is not None
    recorded = [m.event_id for m in await bot.runtime.store.messages_since(record.id, 0) if m.role == "user"]
    assert recorded == ["EvOld", "EvNew"]
