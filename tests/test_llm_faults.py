"""LLM faults through the real openai client: retried, or a clear message."""

from __future__ import annotations

from tests.conftest import RuntimeFactory
from tests.fake_llm import (
    RETRY_NOW,
    FakeLLMServer,
    RefusedPort,
    fault_delay,
    fault_disconnect,
    fault_malformed_json,
    fault_status,
    reply_tool_calls,
    tool_call,
)
from tests.helpers import said


async def test_429_then_success_is_retried(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.script(
        fault_status(429, headers=RETRY_NOW),
        fault_status(429, headers={"retry-after": "0.01"}),
        reply_tool_calls(tool_call("send_message", {"message": "made it"})),
    )
    runtime = await make_runtime(llm_max_retries=2)
    result = await runtime.handle_with_details(said("hi"))
    assert [r.text for r in result.replies] == ["made it"]
    assert result.trouble is None
    assert len(llm_server.raw_requests) == 3


async def test_persistent_500_gives_a_clear_message_and_keeps_the_message(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(lambda request: fault_status(500, headers=RETRY_NOW))
    runtime = await make_runtime(llm_max_retries=1)
    result = await runtime.handle_with_details(said("are you there? marker-5150"))
    assert len(result.replies) == 1
    assert "having trouble" in result.replies[0].text
    assert "saved" in result.replies[0].text
    assert len(llm_server.raw_requests) == 2  # one try plus one retry
    agent = await runtime.agent("terminal:alice")
    found = await runtime.store.search_messages(agent.id, "marker-5150", 5)
    assert found.total == 1
    # Once the server recovers, the agent answers and still has the message in context.
    llm_server.set_handler(None)
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "I'm back"})))
    assert [r.text for r in await runtime.handle(said("hello again"))] == ["I'm back"]
    assert "marker-5150" in str(llm_server.requests[-1]["messages"])


async def test_timeout_gives_a_clear_message(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    # Too slow for the step, and for the plain-text request the rest of the time allows.
    llm_server.script(fault_delay(3.0), fault_delay(3.0))
    runtime = await make_runtime(llm_timeout=0.5, llm_max_retries=0)
    result = await runtime.handle_with_details(said("slow?"))
    assert result.trouble is not None and "in time" in result.trouble
    assert [r.text for r in result.replies] == [result.trouble]
    assert [bool(request.get("tools")) for request in llm_server.requests] == [True, False]


async def test_malformed_body_and_disconnect(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.script(fault_malformed_json())
    runtime = await make_runtime(llm_max_retries=0)
    result = await runtime.handle_with_details(said("one"))
    assert result.trouble is not None and "error" in result.trouble
    llm_server.script(fault_disconnect(), reply_tool_calls(tool_call("send_message", {"message": "reconnected"})))
    runtime_retrying = await make_runtime(llm_max_retries=1)
    assert [r.text for r in await runtime_retrying.handle(said("two"))] == ["reconnected"]


async def test_a_server_that_is_down_is_not_called_slow(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    """The SDK's aiohttp transport (bot/llm/client.py) reports a refused connection or a
    connection the server closed as a connect timeout; the person is told the
    server can't be reached, and a slow server is still "not answering in time"."""
    with RefusedPort() as refused:
        down = await make_runtime(llm_max_retries=0, openai_base_url=refused.base_url)
        result = await down.handle_with_details(said("anyone home?"))
    assert result.trouble is not None and "can't connect" in result.trouble, result.trouble
    llm_server.script(fault_disconnect())
    cut = await make_runtime(llm_max_retries=0)
    result = await cut.handle_with_details(said("still there?"))
    assert result.trouble is not None and "can't connect" in result.trouble, result.trouble
    llm_server.script(fault_delay(3.0), fault_delay(3.0))  # the step, then the plain-text request
    slow = await make_runtime(llm_timeout=0.5, llm_max_retries=0)
    result = await slow.handle_with_details(said("slow?"))
    assert result.trouble is not None and "in time" in result.trouble, result.trouble
