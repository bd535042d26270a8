"""Token counting and the queue manager's eviction rules, with real tiktoken counts."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from bot.functions.core import build_core_functions
from bot.prompts import SYSTEM_INSTRUCTIONS
from memory.queue_manager import QueueManager
from memory.tokens import TokenCounter, load_encoder
from memory.types import Message


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter(load_encoder("some-local-model", "cl100k_base"))


def test_offline_encoding_is_the_real_cl100k(counter: TokenCounter) -> None:
    assert counter.encoding_name.startswith("cl100k_base")
    # Known cl100k_base token ids: the real file, not an estimate.
    assert counter.encoder.encode_ordinary("hello world") == [15339, 1917]
    assert counter.count("tiktoken is great!") == 6


def test_unloadable_model_encoding_is_logged_not_silent(caplog: pytest.LogCaptureFixture) -> None:
    load_encoder.cache_clear()
    with caplog.at_level(logging.WARNING, logger="memory.tokens"):
        encoder = load_encoder("gpt-4o", "cl100k_base")
    # gpt-4o wants o200k_base, which is not available offline here: the
    # fallback is used and the log says so.
    if encoder.name.startswith("o200k"):
        pytest.skip("o200k_base is available on this machine")
    assert encoder.name.startswith("cl100k_base")
    assert any("o200k_base" in r.getMessage() and "instead" in r.getMessage() for r in caplog.records)


def make_queue(counter: TokenCounter, window: int = 4_096) -> QueueManager:
    return QueueManager(counter, SYSTEM_INSTRUCTIONS, build_core_functions().schemas, window, response_reserve=256)


def conversation(turns: int) -> list[Message]:
    messages: list[Message] = []
    seq = 1
    for turn in range(turns):
        calls = [
            {
                "id": f"c{turn}",
                "type": "function",
                "function": {"name": "send_message", "arguments": f'{{"message": "answer {turn}"}}'},
            }
        ]
        for message in (
            Message(role="user", content=f"question {turn}: " + "words " * 20),
            Message(role="assistant", content="thinking", tool_calls=calls),
            Message(role="tool", tool_call_id=f"c{turn}", content='{"status": "OK", "result": "Sent."}'),
        ):
            message.seq = seq
            seq += 1
            messages.append(message)
    return messages


def test_cached_total_bounds_a_full_recount(counter: TokenCounter) -> None:
    queue = make_queue(counter)
    queue.load("An earlier summary about the person.", conversation(12), "<human>Likes tea.</human>")
    status = "40 messages in recall storage; 0 passages"
    recount = counter.count_request(queue.compile(status), queue.tools)
    cached = queue.total_tokens(status)
    assert recount <= cached <= recount * 1.03 + 20


async def summarize_ok(previous: str, evicted: Sequence[Message], budget: int) -> str:
    return f"summary of {len(evicted)} messages after: {previous}"


async def test_eviction_never_splits_a_call_from_its_result(counter: TokenCounter) -> None:
    queue = make_queue(counter, window=2_048)
    queue.load("", conversation(8), "")
    while not queue.needs_flush("status"):
        extra = conversation(1)[0]
        extra.seq = queue.entries[-1].message.seq + 1
        queue.append(extra)
    eviction = await queue.evict("status", summarize_ok)
    queue.apply(eviction)
    assert queue.entries[0].message.role != "tool"
    assert eviction.new_start_seq == queue.entries[0].message.seq
    assert not queue.needs_flush("status")
    # Every tool result left in the queue still has its call before it.
    seen_calls = set()
    for entry in queue.entries:
        for call in entry.message.tool_calls or []:
            seen_calls.add(call["id"])
        if entry.message.role == "tool":
            assert entry.message.tool_call_id in seen_calls
    assert queue.summary.startswith(f"summary of {len(eviction.evicted)} messages")


async def test_failed_summarizer_falls_back_to_a_truncated_summary(counter: TokenCounter) -> None:
    async def broken(previous: str, evicted: Sequence[Message], budget: int) -> str:
        raise RuntimeError("LLM down")

    queue = make_queue(counter, window=2_048)
    queue.load("OLD-SUMMARY", conversation(30), "")
    eviction = await queue.evict("status", broken)
    assert not eviction.summarized_by_llm
    assert eviction.summary.startswith("OLD-SUMMARY")
    assert counter.count(eviction.summary) <= queue.summary_budget()


def test_oversized_item_is_shown_shortened_but_kept_whole(counter: TokenCounter) -> None:
    queue = make_queue(counter, window=2_048)
    huge = Message(role="user", content="lorem ipsum " * 2_000, seq=1)
    queue.load("", [huge], "")
    shown = queue.entries[0]
    assert shown.tokens <= queue.max_item_tokens
    assert "shortened here" in shown.payload["content"]
    assert huge.content == "lorem ipsum " * 2_000


async def test_a_flush_keeps_the_current_events_messages(counter: TokenCounter) -> None:
    # On a small window the queue's low-water mark can be below its newest two items:
    # the person's message, then the pressure alert its arrival set off.
    queue = make_queue(counter, window=2_048)
    messages = conversation(8)
    person = Message(role="user", content="the question to answer " + "words " * 250)
    alert = Message(role="user", name="system_alert", content="[system alert] [memory pressure] save things")
    person.seq, alert.seq = 100, 101
    queue.load("", [*messages, person, alert], "")
    queue.protected_seq = None
    unprotected = queue._cut_index("status")
    assert unprotected == len(queue.entries) - 1  # without protection, the person's message goes too
    queue.protected_seq = person.seq
    eviction = await queue.evict("status", summarize_ok)
    queue.apply(eviction)
    assert [entry.message for entry in queue.entries] == [person, alert]


async def test_an_edit_reaches_the_system_message_at_the_next_flush(counter: TokenCounter) -> None:
    queue = make_queue(counter)
    queue.load("", conversation(12), "<human>Likes tea.</human>")
    status = "memory status"
    before = queue.compile(status)[0]
    queue.stage_working_context("<human>Likes tea.\nHas a dog named Rex.</human>")
    # The prefix stays whole (the model reads the edit in the queue), counted at the larger text.
    assert queue.compile(status)[0] == before
    assert queue.working_context_tokens == counter.count("<human>Likes tea.\nHas a dog named Rex.</human>")
    assert counter.count_request(queue.compile(status), queue.tools) <= queue.total_tokens(status)
    queue.apply(await queue.evict(status, summarize_ok))
    assert "Has a dog named Rex." in queue.compile(status)[0]["content"]
    assert queue.staged_working_context is None


async def test_on_demand_tools_are_offered_while_a_call_for_them_is_in_the_queue(counter: TokenCounter) -> None:
    functions = build_core_functions()
    queue = QueueManager(
        counter,
        SYSTEM_INSTRUCTIONS,
        functions.schemas,
        4_096,
        response_reserve=256,
        more_tools=functions.on_demand_schemas,
        more_tools_after=functions.on_demand_triggers,
    )
    messages = conversation(12)
    queue.load("", messages[:3], "")
    fixed = queue.fixed_tokens
    assert queue.offered_tools == functions.schemas
    call = [{"id": "m", "type": "function", "function": {"name": "more_functions", "arguments": "{}"}}]
    asked = [
        Message(role="assistant", tool_calls=call, seq=100),
        Message(role="tool", tool_call_id="m", name="more_functions", content='{"status": "OK"}', seq=101),
    ]
    for message in asked + messages[3:]:
        queue.append(message)
    assert queue.offered_tools == functions.schemas + functions.on_demand_schemas
    assert queue.fixed_tokens == fixed + counter.count_tools(queue.offered_tools) - counter.count_tools(
        functions.schemas
    )
    status = "memory status"
    assert counter.count_request(queue.compile(status), queue.offered_tools) <= queue.total_tokens(status)
    # A flush that evicts the call takes the schemas away (the prefix is rewritten then anyway).
    while any(entry.message.seq == 101 for entry in queue.entries):
        assert queue.offered_tools == functions.schemas + functions.on_demand_schemas
        queue.apply(await queue.evict(status, summarize_ok))
    assert queue.offered_tools == functions.schemas and queue.fixed_tokens == fixed
