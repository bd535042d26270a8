"""Function chaining, the step cap, malformed calls and isolation."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, reply_text, reply_tool_calls, tool_call
from tests.helpers import said


def last_tool_result(request: dict[str, Any]) -> dict[str, Any]:
    message = request["messages"][-1]
    assert message["role"] == "tool", message
    return json.loads(message["content"])


async def test_heartbeat_chain_insert_search_reply(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.script(
        reply_tool_calls(
            tool_call(
                "archival_memory_insert",
                {
                    "content": "Alice's sister Beatrice lives in Lisbon and works as a marine biologist.",
                    "request_heartbeat": True,
                },
            )
        ),
        reply_tool_calls(
            tool_call(
                "archival_memory_search",
                {
                    "query": "where does her sibling live?",
                    "request_heartbeat": True,
                },
            )
        ),
        reply_tool_calls(tool_call("send_message", {"message": "Your sister is in Lisbon."})),
    )
    runtime = await make_runtime()
    result = await runtime.handle_with_details(said("Remember: my sister Beatrice lives in Lisbon."))
    assert [reply.text for reply in result.replies] == ["Your sister is in Lisbon."]
    assert result.steps == 3 and not result.hit_step_cap
    search_result = last_tool_result(llm_server.requests[2])
    assert search_result["status"] == "OK"
    assert "Beatrice lives in Lisbon" in search_result["result"]
    assert "Page 0" in search_result["result"]


async def test_calls_carry_the_bots_own_short_ids(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    """The server's call ids never reach a later request: each call gets 9 digits (3 tokens
    where a server's take about 15; Mistral takes exactly 9 alphanumerics), unique in the
    agent's history, and its result the same; a function with nothing to tell gives its status alone."""
    first = [
        tool_call("archival_memory_insert", {"content": f"Fact {n}.", "request_heartbeat": n == 2}) for n in (1, 2)
    ]
    first.append(tool_call("send_message", {"message": "Noted."}))
    server_ids = {call.id for call in first}
    llm_server.script(
        reply_tool_calls(*first),
        reply_tool_calls(tool_call("send_message", {"message": "Done."})),
        reply_tool_calls(tool_call("send_message", {"message": "Hello again."})),
    )
    runtime = await make_runtime()
    await runtime.handle(said("Remember two facts."))
    await runtime.handle(said("Hi."))
    last = llm_server.requests[-1]["messages"]
    ids = [call["id"] for m in last if m["role"] == "assistant" for call in m.get("tool_calls") or []]
    assert len(ids) == 4 and len(set(ids)) == 4 and all(re.fullmatch(r"\d{9}", i) for i in ids), ids
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ids
    assert not server_ids & {str(m.get("tool_call_id")) for m in last} and all(i not in str(last) for i in server_ids)
    assert [json.loads(m["content"]) for m in last if m["role"] == "tool"] == [{"status": "OK"}] * 4


async def test_step_cap_stops_an_endless_chain(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.set_handler(
        lambda request: (
            # A new note at every step: no function loop (bot/function_loops.py), which ends a chain sooner.
            reply_tool_calls(
                tool_call(
                    "core_memory_append",
                    {"name": "human", "content": f"Note {len(request['messages'])}.", "request_heartbeat": True},
                )
            )
            if request.get("tools")
            else reply_text("I noted it all.")
        )
    )
    runtime = await make_runtime(max_steps_per_event=4)
    with caplog.at_level(logging.WARNING):
        result = await runtime.handle_with_details(said("loop forever"))
    assert result.hit_step_cap and result.steps == 4
    # Four steps, then one request without functions for a plain-text answer, which is sent.
    assert [bool(request.get("tools")) for request in llm_server.requests] == [True] * 4 + [False]
    assert [r.text for r in result.replies] == ["I noted it all."]
    assert any("step cap of 4 reached" in record.getMessage() for record in caplog.records)
    # The agent is not stuck: the next event runs normally.
    llm_server.set_handler(None)
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "back to normal"})))
    assert [r.text for r in await runtime.handle(said("hello?"))] == ["back to normal"]


MALFORMED_CALLS = {
    "bad json": (tool_call("core_memory_append", '{"name": "human", "content": '), "not valid JSON"),
    "unknown function": (tool_call("delete_everything", {"confirm": True}), "Unknown function"),
    "missing argument": (tool_call("core_memory_append", {"name": "human", "request_heartbeat": True}), "content"),
    "wrong type": (tool_call("conversation_search", {"query": 42, "request_heartbeat": True}), "query"),
    "extra argument": (tool_call("send_message", {"message": "hi", "user_id": "bob"}), "unexpected argument"),
    "unknown block": (
        tool_call("core_memory_append", {"name": "secrets", "content": "x", "request_heartbeat": False}),
        "No memory block named 'secrets'",
    ),
    "block over limit": (
        tool_call("core_memory_append", {"name": "human", "content": "x" * 5000, "request_heartbeat": False}),
        "over its limit",
    ),
    "old_content not found": (
        tool_call(
            "core_memory_replace",
            {
                "name": "persona",
                "old_content": "text that is not there",
                "new_content": "y",
                "request_heartbeat": False,
            },
        ),
        "old_content not found",
    ),
    "arguments not an object": (tool_call("send_message", "[1, 2]"), "JSON object"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_CALLS))
async def test_malformed_call_returns_error_and_agent_recovers(
    case: str, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    bad_call, expected = MALFORMED_CALLS[case]
    llm_server.script(
        reply_tool_calls(bad_call),
        reply_tool_calls(tool_call("send_message", {"message": "Sorry, fixed it."})),
    )
    runtime = await make_runtime()
    result = await runtime.handle_with_details(said("hello"))
    # The failure earned a heartbeat, the model saw the error and recovered.
    assert len(llm_server.requests) == 2
    error = last_tool_result(llm_server.requests[1])
    assert error["status"] == "Failed"
    assert expected in error["result"]
    assert [reply.text for reply in result.replies] == ["Sorry, fixed it."]
    agent = await runtime.agent("terminal:alice")
    assert "x" * 100 not in agent.working_context.get("human").value


async def test_reply_without_a_function_call_is_nudged_when_plain_text_replies_are_off(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.script(
        reply_text("Hello there (but not through send_message)"),
        reply_tool_calls(tool_call("send_message", {"message": "Hello there!"})),
    )
    runtime = await make_runtime(plain_text_replies=False)
    replies = await runtime.handle(said("hi"))
    assert [reply.text for reply in replies] == ["Hello there!"]
    assert "called no function" in llm_server.requests[1]["messages"][-1]["content"]


async def test_a_plain_text_answer_is_sent_as_the_reply(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.script(reply_text("  Hello there, in plain text.  "))
    runtime = await make_runtime()
    replies = await runtime.handle(said("hi"))
    assert [reply.text for reply in replies] == ["Hello there, in plain text."]
    assert len(llm_server.requests) == 1  # no nudge, no second step
    # The model sees its own answer in the next prompt, as an assistant message.
    llm_server.script(reply_text("again"))
    await runtime.handle(said("and now?"))
    sent = llm_server.requests[-1]["messages"]
    assert {"role": "assistant", "content": "  Hello there, in plain text.  "} in sent


async def test_core_memory_replace_edits_and_persists(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.script(
        reply_tool_calls(
            tool_call("core_memory_append", {"name": "human", "content": "Lives in Paris.", "request_heartbeat": True})
        ),
        reply_tool_calls(
            tool_call(
                "core_memory_replace",
                {"name": "human", "old_content": "Paris", "new_content": "Berlin", "request_heartbeat": True},
            )
        ),
        reply_tool_calls(tool_call("send_message", {"message": "Noted: Berlin."})),
    )
    runtime = await make_runtime()
    await runtime.handle(said("I moved from Paris to Berlin"))
    agent = await runtime.agent("terminal:alice")
    assert agent.working_context.get("human").value == "Lives in Berlin."
    blocks = {b.label: b.value for b in await runtime.store.load_blocks(agent.id)}
    assert blocks["human"] == "Lives in Berlin."


async def test_two_users_never_see_each_others_memory(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    secret = "The vault code is 7741-ALPHA-ZULU"
    llm_server.script(
        reply_tool_calls(tool_call("archival_memory_insert", {"content": secret, "request_heartbeat": False})),
        reply_text("Kept safe."),  # the chain sent nothing: the plain-text answer
        reply_tool_calls(tool_call("conversation_search", {"query": "vault code", "request_heartbeat": True})),
        reply_tool_calls(
            tool_call("archival_memory_search", {"query": "the code of the vault", "request_heartbeat": True})
        ),
        reply_tool_calls(tool_call("send_message", {"message": "I know nothing about a vault."})),
    )
    runtime = await make_runtime()
    await runtime.handle(said(f"Keep this safe: {secret}", user="alice"))
    await runtime.handle(said("What is the vault code?", user="bob"))
    recall_result = last_tool_result(llm_server.requests[3])["result"]
    archival_result = last_tool_result(llm_server.requests[4])["result"]
    assert "7741" not in recall_result
    assert "7741" not in archival_result
    # Bob's whole last prompt holds nothing of Alice's.
    assert "7741" not in json.dumps(llm_server.requests[4])
    alice = await runtime.agent("terminal:alice")
    found = await runtime.archival.search(alice.id, "vault code", 5)
    assert found.items and "7741" in found.items[0][0].text


async def test_a_search_shows_a_message_line_with_its_time_once(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.script(
        reply_tool_calls(tool_call("send_message", {"message": "Lovely!"})),
        reply_tool_calls(tool_call("conversation_search", {"query": "tomatoes", "request_heartbeat": True})),
        reply_tool_calls(tool_call("send_message", {"message": "They were ripe."})),
    )
    runtime = await make_runtime()
    await runtime.handle(said("My tomatoes are ripe.", user="alice"))
    await runtime.handle(said("What did I say about tomatoes?", user="alice"))
    lines = last_tool_result(llm_server.requests[2])["result"].splitlines()
    found = [line for line in lines if line.endswith("My tomatoes are ripe.")]
    stamped_once = r"- \[\d{4}-\d\d-\d\d \d\d:\d\d UTC\] alice: My tomatoes are ripe\."
    assert len(found) == 1 and re.fullmatch(stamped_once, found[0]), found
