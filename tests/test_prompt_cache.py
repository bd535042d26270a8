"""The prompt is cache-stable: read from the request bodies the local LLM
server received, each step's request starts with the previous one's messages
until a flush rewrites the prefix (a working-context edit is in the queue at
once, and the system message takes it at the next flush); flushes come only
under pressure; the memory status reaches the model on each event's first call
(a heartbeat step's only after an alert or a flush changed it); no request
exceeds the window. And what a server says it cached is recorded and shown."""

from __future__ import annotations

import itertools
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.events import UserMessage
from bot.limits import CACHED_TOKENS, PROMPT_TOKENS
from cli.limits import render_usage, usage_json
from memory.queue_manager import STATUS_MARKER
from memory.tokens import TokenCounter, load_encoder
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, Reply, is_summary_request, reply_text, reply_tool_calls, tool_call

WINDOW = 4_096
STATUS_FIELD = re.compile(r', "memory_status": "(?:[^"\\]|\\.)*"\}$')


def without_status(message: dict[str, Any]) -> dict[str, Any]:
    """The newest message as the queue holds it (the status is attached per request)."""
    content = str(message.get("content") or "")
    if message["role"] != "tool":
        content = content.partition(f"\n{STATUS_MARKER}")[0]  # it rides after the text
    return {**message, "content": STATUS_FIELD.sub("}", content)}


STATUS = re.compile(r"memory \d+% full; recall \d+ messages, archival \d+ passages(?:; now (?P<now>[\d :-]+ UTC))?$")
EVENT_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d UTC)\] ")


def carries_status(request: dict[str, Any]) -> bool:
    """The newest message carries the counts, and the time only once the clock
    has moved past the current event's (whose line opens with its own)."""
    message = request["messages"][-1]
    content = str(message.get("content") or "")
    status = content.partition(f"\n{STATUS_MARKER} ")[2]
    if message["role"] == "tool":
        status = json.loads(content).get("memory_status", "")
    found = STATUS.match(status)
    stamps = [EVENT_STAMP.match(str(m.get("content") or "")) for m in request["messages"] if m["role"] == "user"]
    event = [s.group(1) for s in stamps if s][-1]
    return bool(found) and found.group("now") != event


def chatty_model(request: dict[str, Any]) -> Reply:
    if is_summary_request(request):
        return reply_text("Summary: Alice chats about her garden, her sister and her plans.")
    newest = without_status(request["messages"][-1])
    said = str(newest.get("content") or "")
    if newest["role"] == "user" and "Remember:" in said:
        fact = said.split("Remember:", 1)[1].strip()
        return reply_tool_calls(
            tool_call("core_memory_append", {"name": "human", "content": fact, "request_heartbeat": True})
        )
    if newest["role"] == "user" and "look it up" in said:
        return reply_tool_calls(tool_call("conversation_search", {"query": "garden", "request_heartbeat": True}))
    return reply_tool_calls(tool_call("send_message", {"message": "Lovely, tell me more about the garden!"}))


async def test_requests_between_flushes_extend_the_previous_prompt(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(chatty_model)
    runtime = await make_runtime(context_window=WINDOW, response_reserve=256, persona_limit=400, human_limit=600)
    for turn in range(70):
        if turn % 23 == 5:
            text = f"Remember: fact {turn} about Alice."
        elif turn % 9 == 4:
            text = "Can you look it up for me?"
        else:
            text = f"Turn {turn}: the tomatoes in my garden are growing well, and the basil too."
        await runtime.handle(UserMessage(platform="terminal", user_id="alice", display_name="alice", text=text))

    counter = TokenCounter(load_encoder("test-model"))
    requests = list(llm_server.requests)
    sizes = [counter.count_request(r["messages"], r.get("tools") or []) for r in requests]
    assert max(sizes) <= WINDOW, f"largest request {max(sizes)} tokens"

    steps = [r for r in requests if not is_summary_request(r)]
    # An event's first step (its newest message the person's, or an alert) sees the status; a
    # heartbeat step (its newest a function result) not again, unless a flush just changed it.
    firsts = [r for r in steps if r["messages"][-1]["role"] == "user"]
    heartbeats = [
        r
        for before, r in itertools.pairwise(requests)
        if r["messages"][-1]["role"] == "tool" and not is_summary_request(r) and not is_summary_request(before)
    ]
    assert firsts and all(carries_status(r) for r in firsts), "every event's first step sees the memory status"
    assert heartbeats and not any("memory_status" in r["messages"][-1]["content"] for r in heartbeats)
    assert all(STATUS_MARKER not in str(m.get("content")) for r in steps for m in r["messages"][1:-1])

    def appended(request: dict[str, Any]) -> set[str]:
        """The ids of the successful appends whose results the request carries."""
        return {
            m["tool_call_id"]
            for m in request["messages"]
            if m["role"] == "tool" and json.loads(without_status(m)["content"]).get("result", "").startswith("Appended")
        }

    extended = rewritten = edits_between_steps = 0
    flushes = sum(map(is_summary_request, requests))
    for index in range(1, len(requests)):
        before, after = requests[index - 1], requests[index]
        if is_summary_request(before) or is_summary_request(after):
            continue
        # An edit since the previous step (a flush between rewrites the system message anyway).
        edits_between_steps += bool(appended(after) - appended(before))
        old, new = before["messages"], after["messages"]
        if old[0] != new[0]:
            rewritten += 1
            continue
        assert after["tools"] == before["tools"]
        assert len(new) > len(old)
        assert new[: len(old) - 1] == old[:-1], f"request {index} does not repeat the previous prompt"
        assert new[len(old) - 1] == without_status(old[-1])
        extended += 1
    assert flushes >= 2 and extended > 5 * flushes
    # No edit the model made rewrote the system message between two steps: the
    # whole prefix stayed cached. (Edits counted by the results the model saw.)
    assert edits_between_steps >= 1
    assert rewritten == 0
    # Each edit is in the requests' queue at once, and in the system message from
    # the first step after the next flush on (not before: the prefix stays whole).
    facts = {f"fact {turn} about Alice." for turn in range(70) if turn % 23 == 5}
    for fact in facts:
        saved = next(i for i, r in enumerate(requests) if fact in json.dumps(r["messages"][1:]))
        flushed = next((i for i in range(saved, len(requests)) if is_summary_request(requests[i])), None)
        later = [r for r in requests[saved:flushed] if not is_summary_request(r)]
        assert all(fact in json.dumps(r["messages"][1:]) and fact not in r["messages"][0]["content"] for r in later)
        if flushed is not None:
            after = next(r for r in requests[flushed:] if not is_summary_request(r))
            assert fact in after["messages"][0]["content"]

    # A flush only under pressure: the step before it was near the flush limit.
    agent = await runtime.agent("terminal:alice")
    shared = 0
    for index, request in enumerate(requests):
        if is_summary_request(request):
            previous = max(i for i in range(index) if not is_summary_request(requests[i]))
            assert sizes[previous] >= 0.7 * agent.queue.flush_limit, "a flush while memory was not under pressure"
            if "tools" not in request:
                # The fallback when the agent's own prompt up to the evicted
                # messages, with the ask, would not fit: a transcript of them.
                assert len(request["messages"]) == 2 and sizes[index] <= agent.queue.flush_limit
                continue
            # The summarizer reads the agent's own prompt: the previous step's
            # tools, system message and queue up to the evicted messages, then the ask.
            shared += 1
            before, summary = requests[previous], request["messages"]
            assert request["tools"] == before["tools"] and request["tool_choice"] == "none"
            # (the status rode in the previous request's newest message, which may be evicted)
            newest = len(before["messages"]) - 1
            head = before["messages"][: len(summary) - 1]
            assert summary[1:-1] == [without_status(m) if i == newest else m for i, m in enumerate(head)][1:]
            # Its system message is the previous step's.
            assert summary[0] == before["messages"][0]
            assert len(summary) - 2 >= 1 and summary[-1]["content"].startswith("[system alert] Your queue is full")
    assert shared >= 1 and 2 * shared >= flushes, "summaries are written from the cached prefix where it fits"


async def test_cached_tokens_the_server_reports_are_recorded_and_shown(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    usage = {
        "prompt_tokens": 1_200,
        "completion_tokens": 20,
        "total_tokens": 1_220,
        "prompt_tokens_details": {"cached_tokens": 1_024},
    }
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "Hello!"}), usage=usage))
    runtime = await make_runtime(daily_token_budget=1_000_000, cached_token_weight=0.25)
    agent = await runtime.agent("terminal:alice")
    result = await runtime.handle_with_details(UserMessage(platform="terminal", user_id="alice", text="hi"))

    parts = agent.usage
    assert parts.cached == 1_024 and parts.prompt > parts.cached and parts.completion > 0
    # The budget counts locally; the cached share at its weight.
    assert result.tokens_used == parts.prompt - 1_024 + 256 + parts.completion

    usage_now = await runtime.limits.usage("terminal:alice")
    today = usage_now.days[0]
    assert (today.prompt, today.cached, today.completion) == (parts.prompt, 1_024, parts.completion)
    assert today.charged == result.tokens_used
    assert (await runtime.store.usage_since("terminal:alice", CACHED_TOKENS, today.day)).amount == 1_024
    assert (await runtime.store.usage_since("terminal:alice", PROMPT_TOKENS, today.day)).amount == parts.prompt
    shown = render_usage(usage_now)
    assert f"prompt {parts.prompt:,} (cached 1,024)" in shown
    assert usage_json(usage_now)["tokens_by_day"][0]["cached"] == 1_024


async def test_a_server_without_cache_details_records_none(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "Hello!"})))
    runtime = await make_runtime(daily_token_budget=1_000_000, cached_token_weight=0.25)
    result = await runtime.handle_with_details(UserMessage(platform="terminal", user_id="alice", text="hi"))
    today = (await runtime.limits.usage("terminal:alice")).days[0]
    assert today.cached == 0 and today.prompt > 0
    assert today.charged == result.tokens_used == today.prompt + today.completion


async def test_summary_model_is_used_for_summaries_only(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(chatty_model)
    runtime = await make_runtime(context_window=2_048, response_reserve=128, summary_model="cheap-model")
    for turn in range(40):
        await runtime.handle(UserMessage(platform="terminal", user_id="alice", text=f"Turn {turn} " + "words " * 30))
    models = {(is_summary_request(r), r["model"]) for r in llm_server.requests}
    assert (True, "cheap-model") in models
    assert models <= {(True, "cheap-model"), (False, "test-model")}


async def test_the_status_gives_the_time_once_the_clock_has_moved_past_the_event(
    make_runtime: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = await make_runtime()
    agent = await runtime.agent("terminal:alice")
    now = datetime(2026, 12, 7, 19, 24, 30, tzinfo=UTC)
    monkeypatch.setattr("bot.agent.utc_now", lambda: now)
    assert agent.status_line().endswith("; now 2026-12-07 19:24 UTC"), "no event: the status alone tells the time"
    agent.current_event = UserMessage(platform="terminal", user_id="alice", text="hi", created_at=now)
    assert agent.current_event.render().startswith("[2026-12-07 19:24 UTC] ")
    assert agent.status_line().endswith(" passages"), "the event's line already says 19:24"
    agent.current_event.created_at = now - timedelta(minutes=1)
    assert agent.status_line().endswith("; now 2026-12-07 19:24 UTC")
