"""The one durable path every platform's events take (adapters/pipeline.py), through
its official test double (adapters/fake.py) and a real runtime on SQLite talking to
the scripted local LLM server: what holds for Slack, Discord and the terminal alike."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.fake import FakePlatform
from adapters.pipeline import APOLOGY, Pipeline, PipelineClosing
from bot.durable.lanes import Turn
from bot.events import Event, Reply
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, say
from tests.helpers import user_texts
from tests.recording_bot import RecordingBot


def user_lines(request: dict[str, Any]) -> list[str]:
    return user_texts(request)


async def test_a_message_is_answered_once_and_a_repeat_delivery_is_dropped(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    runtime = await make_runtime()
    platform = FakePlatform()
    pipeline = Pipeline(runtime, platform)
    llm_server.set_handler(lambda request: say("hello Alice"))
    await platform.message(pipeline, "alice", "hi", event_id="E1")
    await platform.message(pipeline, "alice", "hi", event_id="E1")  # delivered again
    assert [reply.text for reply in platform.sent] == ["hello Alice"]
    assert len(llm_server.requests) == 1
    [entry] = await runtime.store.outbox_for_event("E1")
    assert entry.state == "sent"
    assert await runtime.store.inbox_pending("fake") == []


async def test_a_failure_earns_one_apology() -> None:
    class Broken(RecordingBot):
        async def handle(self, event: Event, turn: Turn | None = None) -> list[Reply]:
            raise RuntimeError("a bug")

    platform = FakePlatform()
    pipeline = Pipeline(Broken(), platform)
    await platform.message(pipeline, "alice", "hi")
    assert [reply.text for reply in platform.sent] == [APOLOGY]


async def test_quick_messages_are_one_event_with_one_answer(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    runtime = await make_runtime()
    platform = FakePlatform()
    pipeline = Pipeline(runtime, platform, debounce_seconds=0.3)
    llm_server.set_handler(lambda request: say("one answer"))
    first = await pipeline.take(platform.arrival("alice", "I moved"))
    assert await pipeline.take(platform.arrival("alice", "to Lisbon")) is None  # joined the burst
    assert first is not None
    await first
    assert [reply.text for reply in platform.sent] == ["one answer"]
    [request] = llm_server.requests
    assert [line.rsplit(": ", 1)[-1] for line in user_lines(request)[-2:]] == ["I moved", "to Lisbon"]
    assert await runtime.store.inbox_pending("fake") == []


async def test_what_a_crash_left_unfinished_is_answered_at_start_before_new_messages(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    runtime = await make_runtime()
    platform = FakePlatform()
    # The last run recorded "number 1" and stopped.
    old = platform.arrival("alice", "number 1", event_id="Old")
    assert await runtime.receive("fake", old.event_id, old.user_id, old.payload)
    llm_server.set_handler(lambda request: say("ok " + user_lines(request)[-1].rsplit(" ", 1)[-1]))
    pipeline = Pipeline(runtime, platform)
    pipeline.hold_new_events()
    new = await pipeline.take(platform.arrival("alice", "number 2", event_id="New"))
    assert await pipeline.recover() == 2  # both in the inbox by now; the old one first
    assert new is not None
    await new
    assert [reply.text for reply in platform.sent] == ["ok 1", "ok 2"]
    assert await runtime.store.inbox_pending("fake") == []


async def test_a_reply_the_platform_refuses_waits_in_the_outbox(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    runtime = await make_runtime()
    platform = FakePlatform(fail_sends=1)
    pipeline = Pipeline(runtime, platform)
    llm_server.set_handler(lambda request: say("hello"))
    await platform.message(pipeline, "alice", "hi", event_id="E1")
    assert platform.sent == []
    [entry] = await runtime.store.outbox_for_event("E1")
    assert entry.state == "pending" and entry.attempts == 1


async def test_closing_keeps_or_refuses_what_arrives_by_whether_the_platform_sends_it_again(
    make_runtime: RuntimeFactory,
) -> None:
    runtime = await make_runtime()
    once, again = FakePlatform(), FakePlatform(name="again", redelivers=True)
    pipelines = Pipeline(runtime, once), Pipeline(runtime, again)
    for pipeline in pipelines:
        await pipeline.close()
    # Never sent again: kept in the inbox for the next start.
    assert await pipelines[0].take(once.arrival("alice", "late", event_id="Late")) is None
    assert [redo.event_id for redo in await runtime.leftovers("fake")] == ["Late"]
    # Sent again until acknowledged: refused, not recorded.
    with pytest.raises(PipelineClosing):
        await pipelines[1].take(again.arrival("alice", "late", event_id="Late2"))
    assert await runtime.leftovers("again") == []
    assert once.sent == again.sent == []
