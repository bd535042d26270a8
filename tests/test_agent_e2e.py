"""End to end through the runtime: real SQLite, real HTTP to the scripted
model through the openai client, real embeddings."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call
from tests.helpers import said


async def test_fact_is_saved_and_survives_a_restart(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    llm_server.script(
        reply_tool_calls(
            tool_call(
                "core_memory_append",
                {"name": "human", "content": "Name: Alice. Has a cat called Miso.", "request_heartbeat": True},
            ),
            content="She told me about her cat; saving it.",
        ),
        reply_tool_calls(tool_call("send_message", {"message": "Miso is a lovely name!"})),
    )
    runtime = await make_runtime(tmp_path / "data")
    replies = await runtime.handle(said("Hi, I'm Alice and my cat is called Miso."))
    assert [reply.text for reply in replies] == ["Miso is a lovely name!"]
    assert len(llm_server.requests) == 2

    first, second = llm_server.requests
    system = first["messages"][0]
    assert system["role"] == "system"
    assert "Working context" in system["content"]
    assert {tool["function"]["name"] for tool in first["tools"]} >= {
        "send_message",
        "core_memory_append",
        "core_memory_replace",
        "conversation_search",
        "archival_memory_insert",
        "archival_memory_search",
        "more_functions",  # conversation_search_date and the others, on demand
    }
    assert "my cat is called Miso" in first["messages"][-1]["content"]
    # The heartbeat step saw the function's result and the edit, in its queue: the
    # system message is the first step's (its cached prefix whole) until the next flush.
    assert second["messages"][-1]["role"] == "tool"
    assert json.loads(second["messages"][-1]["content"])["status"] == "OK"
    assert "Has a cat called Miso." in second["messages"][-2]["tool_calls"][0]["function"]["arguments"]
    assert second["messages"][0] == system
    await runtime.close(close_embedder=False)

    # A new runtime on the same data directory is a restarted bot.
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "Welcome back!"})))
    restarted = await make_runtime(tmp_path / "data")
    agent = await restarted.agent("terminal:alice")
    assert "Has a cat called Miso." in agent.working_context.get("human").value
    await restarted.handle(said("Do you remember me?"))
    prompt = llm_server.requests[-1]["messages"]
    assert "Has a cat called Miso." in prompt[0]["content"]
    # The queue carried over too: the earlier exchange is still in context.
    assert any("my cat is called Miso" in (m.get("content") or "") for m in prompt[1:])


async def test_user_sees_only_send_message(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.script(
        reply_tool_calls(
            tool_call("send_message", {"message": "First part."}),
            tool_call("send_message", {"message": "Second part."}),
            content="Private thought that must never reach the user.",
        )
    )
    runtime = await make_runtime()
    replies = await runtime.handle(said("hello"))
    assert [reply.text for reply in replies] == ["First part.", "Second part."]
    assert all("Private thought" not in reply.text for reply in replies)
    assert replies[0].event_id and replies[0].platform == "terminal" and replies[0].user_id == "alice"
