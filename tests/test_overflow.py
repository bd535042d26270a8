"""Context overflow: hundreds of turns in a 2,048-token window."""

from __future__ import annotations

import re
from typing import Any

from bot.events import UserMessage
from memory.queue_manager import PRESSURE_MARKER
from memory.tokens import TokenCounter, load_encoder
from tests.conftest import RuntimeFactory
from tests.fake_llm import (
    FakeLLMServer,
    Reply,
    fault_status,
    is_summary_request,
    reply_text,
    reply_tool_calls,
    tool_call,
)

# The fixed prompt must leave a 2,048 window room for messages beside the summary's
# budget (a tenth of the window) and the reply reserve (the rarely needed functions
# are offered on demand, bot/functions/registry.py).
WINDOW = 2_048
TURNS = 240


async def test_hundreds_of_turns_never_exceed_a_small_window(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    summaries: list[str] = []

    def model(request: dict[str, Any]) -> Reply:
        if is_summary_request(request):
            summary = f"SUMMARY-{len(summaries) + 1}: Alice keeps chatting about topics."
            summaries.append(summary)
            return reply_text(summary)
        said = [m["content"] for m in request["messages"] if m["role"] == "user" and "This is turn" in m["content"]]
        turn = re.search(r"turn (\d+)", said[-1]) if said else None
        return reply_tool_calls(tool_call("send_message", {"message": f"ack {turn.group(1) if turn else '?'}"}))

    llm_server.set_handler(model)
    runtime = await make_runtime(context_window=WINDOW, response_reserve=128, persona_limit=300, human_limit=300)
    for turn in range(TURNS):
        replies = await runtime.handle(
            UserMessage(
                platform="terminal",
                user_id="alice",
                display_name="alice",
                text=f"This is turn {turn}. I had a pleasant day and want to tell you about it in detail.",
            )
        )
        assert [r.text for r in replies] == [f"ack {turn}"]

    counter = TokenCounter(load_encoder("test-model"))
    sizes = [counter.count_request(r["messages"], r.get("tools") or []) for r in llm_server.requests]
    assert max(sizes) <= WINDOW, f"largest request {max(sizes)} tokens"

    kinds = []
    for request in llm_server.requests:
        if is_summary_request(request):
            kinds.append("flush")
        elif any(PRESSURE_MARKER in (m.get("content") or "") for m in request["messages"]):
            kinds.append("warned")
        else:
            kinds.append("plain")
    assert "flush" in kinds and "warned" in kinds
    assert kinds.index("warned") < kinds.index("flush"), "the warning must come before the first flush"
    assert kinds.count("flush") >= 5

    # Recursive: every summary request carries an earlier summary, the newest
    # the bot got back. (Not always the one just before: on a busy machine a
    # summary call can time out and be sent again, and the model's first answer
    # to it never reaches the bot.) Where it is depends on the request's form
    # (bot/agent_calls.py summarize): the agent's own prompt with the summary in its
    # system text when that fits, else a transcript under "Previous summary" in the
    # last message; which one fits varies with the timestamps' tokens.
    summary_requests = [r for r in llm_server.requests if is_summary_request(r)]
    carried = []
    for number, request in enumerate(summary_requests[1:], start=2):
        texts = "\n".join(message.get("content") or "" for message in request["messages"])
        found = re.findall(r"SUMMARY-(\d+):", texts)
        assert len(found) == 1, f"summary request {number} carries {found}"
        carried.append(int(found[0]))
        assert carried[-1] < number, f"summary request {number} carries a later summary {found}"
    assert carried == sorted(carried) and len(set(carried)) >= len(carried) - 2, carried
    # And the latest summary is what the model now sees at the top.
    agent = await runtime.agent("terminal:alice")
    assert agent.conversation.record.summary == summaries[-1]

    # Every message is still in recall storage: per turn one user message, one
    # assistant call and one function result, plus the pressure alerts.
    alerts = kinds.count("flush")  # at most one alert per pressure episode
    total = await runtime.store.count_messages(agent.id)
    assert TURNS * 3 <= total <= TURNS * 3 + alerts + 1
    early = await runtime.store.search_messages(agent.id, "turn 3", 50)
    assert any("This is turn 3." in (m.content or "") for m in early.items)


async def test_failed_summary_still_evicts(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    def model(request: dict[str, Any]) -> Reply:
        if is_summary_request(request):
            return fault_status(500, headers={"x-should-retry": "false"})
        return reply_tool_calls(tool_call("send_message", {"message": "ok"}))

    llm_server.set_handler(model)
    runtime = await make_runtime(
        context_window=WINDOW, response_reserve=128, persona_limit=300, human_limit=300, llm_max_retries=0
    )
    for turn in range(60):
        replies = await runtime.handle(
            UserMessage(platform="terminal", user_id="alice", text=f"Message number {turn} with some padding words.")
        )
        assert [r.text for r in replies] == ["ok"]
    counter = TokenCounter(load_encoder("test-model"))
    assert any(is_summary_request(r) for r in llm_server.requests)
    for request in llm_server.requests:
        assert counter.count_request(request["messages"], request.get("tools") or []) <= WINDOW
    agent = await runtime.agent("terminal:alice")
    assert "not summarized" in agent.conversation.record.summary
