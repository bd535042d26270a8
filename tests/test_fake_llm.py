"""The fake OpenAI-compatible server works through the real openai client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from tests.fake_llm import (
    RETRY_NOW,
    FakeLLMServer,
    Reply,
    fake_llm,
    fault_delay,
    fault_disconnect,
    fault_malformed_json,
    fault_status,
    reply_text,
    reply_tool_calls,
    start_fake_llm,
    tool_call,
)

MODEL = "test-model"
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": "hello"},
]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "send_message",
            "description": "Send a message to the user.",
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def module_server() -> Iterator[FakeLLMServer]:
    with fake_llm() as server:
        yield server


@pytest.fixture
def server(module_server: FakeLLMServer) -> FakeLLMServer:
    module_server.reset()
    return module_server


def make_client(server: FakeLLMServer, *, max_retries: int = 0, timeout: float = 5.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=max_retries, timeout=timeout)


@pytest.fixture
async def client(server: FakeLLMServer) -> AsyncIterator[openai.AsyncOpenAI]:
    c = make_client(server)
    yield c
    await c.close()


async def create(client: openai.AsyncOpenAI, **kw: Any) -> Any:
    return await client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, **kw)


# ------------------------------------------------------------------ happy paths


async def test_single_tool_call_is_parsed(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(reply_tool_calls(tool_call("send_message", {"message": "hi!"}, call_id="c1")))
    resp = await create(client)

    assert resp.object == "chat.completion"
    assert resp.model == MODEL
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.role == "assistant"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].id == "c1"
    assert calls[0].type == "function"
    assert calls[0].function.name == "send_message"
    assert json.loads(calls[0].function.arguments) == {"message": "hi!"}
    assert resp.usage is not None and resp.usage.total_tokens > 0
    assert server.pending == 0


async def test_multiple_tool_calls_and_verbatim_arguments(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(
        reply_tool_calls(
            tool_call("core_memory_append", {"name": "human", "content": "likes tea"}),
            tool_call("send_message", '{"message": "oops"'),  # malformed on purpose
            content="thinking...",
        )
    )
    resp = await create(client)

    msg = resp.choices[0].message
    assert msg.content == "thinking..."
    assert msg.tool_calls is not None
    assert [c.function.name for c in msg.tool_calls] == ["core_memory_append", "send_message"]
    assert json.loads(msg.tool_calls[0].function.arguments) == {
        "name": "human",
        "content": "likes tea",
    }
    assert msg.tool_calls[1].function.arguments == '{"message": "oops"'
    assert msg.tool_calls[0].id != msg.tool_calls[1].id


async def test_plain_text_reply(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(reply_text("just words"))
    resp = await create(client)

    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == "just words"
    assert choice.message.tool_calls is None


async def test_request_is_recorded(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(reply_text("a"), reply_text("b"))
    first = await create(client, temperature=0.5)
    second = await client.chat.completions.create(model="other", messages=MESSAGES[:1])

    assert first.choices[0].message.content == "a"
    assert second.choices[0].message.content == "b"
    assert second.model == "other"
    assert len(server.requests) == 2
    req = server.requests[0]
    assert req["model"] == MODEL
    assert req["messages"] == MESSAGES
    assert req["tools"] == TOOLS
    assert req["temperature"] == 0.5
    assert "tools" not in server.requests[1]
    raw = server.raw_requests[0]
    assert raw.method == "POST"
    assert raw.path == "/v1/chat/completions"
    assert raw.headers["authorization"] == "Bearer sk-test"
    assert json.loads(raw.raw_body) == req


async def test_models_endpoint(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    page = await client.models.list()
    assert [m.id for m in page.data]


async def test_a_streamed_reply_reads_as_the_client_reads_one(
    server: FakeLLMServer, client: openai.AsyncOpenAI
) -> None:
    server.script(reply_tool_calls(tool_call("send_message", {"message": "hi"}), content="thinking"))
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "thinking"
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert [(call.function.name, call.function.arguments) for call in calls if call.function] == [
        ("send_message", '{"message": "hi"}')
    ]
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0


async def test_stream_is_rejected_where_asked(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.streaming = False
    server.script(reply_text("unused"))
    with pytest.raises(openai.BadRequestError, match="streaming"):
        await create(client, stream=True)
    assert server.pending == 1


# ------------------------------------------------------------------ faults


async def test_429_then_success_is_retried(server: FakeLLMServer) -> None:
    server.script(
        fault_status(429, headers=RETRY_NOW),
        fault_status(429, headers={"Retry-After": "0.001"}),
        reply_text("finally"),
    )
    async with make_client(server, max_retries=2) as c:
        resp = await create(c)
    assert resp.choices[0].message.content == "finally"
    assert len(server.requests) == 3


async def test_429_without_retries_raises_rate_limit(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(fault_status(429))
    with pytest.raises(openai.RateLimitError):
        await create(client)


async def test_persistent_500_raises_internal_server_error(server: FakeLLMServer) -> None:
    server.set_handler(lambda _req: fault_status(500, headers=RETRY_NOW))
    async with make_client(server, max_retries=2) as c:
        with pytest.raises(openai.InternalServerError) as exc_info:
            await create(c)
    assert exc_info.value.status_code == 500
    assert len(server.requests) == 3  # 1 try + 2 retries


async def test_503_with_custom_body(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(fault_status(503, body="upstream overloaded"))
    with pytest.raises(openai.InternalServerError) as exc_info:
        await create(client)
    assert exc_info.value.status_code == 503


async def test_delay_past_timeout_raises_timeout(server: FakeLLMServer) -> None:
    server.script(fault_delay(1.0))
    async with make_client(server, timeout=0.2) as c:
        with pytest.raises(openai.APITimeoutError):
            await create(c)


async def test_short_delay_then_reply(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(fault_delay(0.05, then=reply_text("late")))
    resp = await create(client)
    assert resp.choices[0].message.content == "late"


async def test_malformed_json_raises(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(fault_malformed_json())
    # The openai client calls response.json() after its retry loop, so a truncated 200 body
    # surfaces as a bare json.JSONDecodeError (a ValueError), NOT an openai.OpenAIError.
    with pytest.raises(json.JSONDecodeError):
        await create(client)


async def test_disconnect_raises_connection_error(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(fault_disconnect(), reply_text("after"))
    with pytest.raises(openai.APIConnectionError) as exc_info:
        await create(client)
    assert not isinstance(exc_info.value, openai.APITimeoutError)
    # the client recovers on a fresh connection
    resp = await create(client)
    assert resp.choices[0].message.content == "after"


# ------------------------------------------------------------------ handler / exhaustion


async def test_handler_fallback(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    def handler(req: dict[str, Any]) -> Reply:
        return reply_text(f"echo: {req['messages'][-1]['content']}")

    server.script(reply_text("scripted first"))
    server.set_handler(handler)
    r1 = await create(client)
    r2 = await create(client)
    assert r1.choices[0].message.content == "scripted first"
    assert r2.choices[0].message.content == "echo: hello"


async def test_exhausted_script_is_a_loud_500(server: FakeLLMServer) -> None:
    async with make_client(server, max_retries=2) as c:
        with pytest.raises(openai.InternalServerError, match="script ran out"):
            await create(c)
    assert len(server.requests) == 1  # x-should-retry: false -> not retried


async def test_handler_exception_is_a_loud_500(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    def handler(_req: dict[str, Any]) -> Reply:
        raise RuntimeError("boom in handler")

    server.set_handler(handler)
    with pytest.raises(openai.InternalServerError, match="boom in handler"):
        await create(client)


async def test_reset_clears_everything(server: FakeLLMServer, client: openai.AsyncOpenAI) -> None:
    server.script(reply_text("x"))
    await create(client)
    server.script(reply_text("left over"))
    server.set_handler(lambda _req: reply_text("h"))
    server.reset()
    assert server.requests == [] and server.raw_requests == [] and server.pending == 0
    with pytest.raises(openai.InternalServerError, match="script ran out"):
        await create(client)


async def test_start_stop_lifecycle() -> None:
    srv = start_fake_llm()
    try:
        assert srv.base_url.startswith("http://127.0.0.1:")
        assert srv.base_url.endswith("/v1")
        srv.script(reply_text("own server"))
        async with make_client(srv) as c:
            resp = await create(c)
        assert resp.choices[0].message.content == "own server"
    finally:
        srv.stop()
    with pytest.raises(RuntimeError):
        _ = srv.base_url
    srv.stop()  # idempotent
