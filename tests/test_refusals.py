"""Each server's words for a refusal, through the real openai client: what the bot
reads from them (bot/llm/refusals.py) and what it sends next."""

from __future__ import annotations

import json

import pytest

from bot.llm import ContextLimitError, LLMClient, LLMUnavailableError, Request
from tests.fake_llm import FakeLLMServer, fault_status, reply_text

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
HI = [{"role": "user", "content": "hi"}]
CALL = [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
]

# (the error object a server sends, the context limit and prompt count it tells)
CONTEXT_REFUSALS = {
    "llama-server": (
        {
            "code": 400,
            "message": "request (4476 tokens) exceeds the available context size (4096 tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 4476,
            "n_ctx": 4096,
        },
        4096,
        4476,
    ),
    "llama-server, older": (
        {"code": 400, "message": "the request exceeds the available context size, try increasing it"},
        None,
        None,
    ),
    "llama-cpp-python": (
        {
            "message": "This model's maximum context length is 2560 tokens. However, you requested 2723 tokens "
            "(2211 in the messages, 512 in the completion). Please reduce the length of the messages or completion.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        },
        2560,
        2211,
    ),
    "llama-cpp-python, raw": ({"message": "Requested tokens (2723) exceed context window of 2560"}, 2560, 2723),
    "OpenAI": (
        {
            "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in "
            "130112 tokens (including 970 in the functions). Please reduce the length of the messages or functions.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        },
        128000,
        130112,
    ),
    "vLLM": (
        {
            "object": "error",
            "message": "This model's maximum context length is 2048 tokens and your request has 2100 input tokens "
            "(512 > 2048 - 2100). (parameter=max_tokens, value=512)",
            "type": "BadRequestError",
        },
        2048,
        2100,
    ),
}


@pytest.mark.parametrize("server", list(CONTEXT_REFUSALS))
async def test_context_limit_refusals_are_read(server: str, llm_server: FakeLLMServer) -> None:
    error, limit, prompt = CONTEXT_REFUSALS[server]
    llm_server.script(fault_status(400, {"error": error}))
    client = LLMClient("m", api_key="k", base_url=llm_server.base_url, max_retries=0)
    try:
        with pytest.raises(ContextLimitError) as caught:
            await client.complete(Request(HI, prompt_tokens=1_000))
    finally:
        await client.close()
    assert (caught.value.limit, caught.value.server_prompt_tokens) == (limit, prompt)
    assert "saved" in caught.value.user_message
    learned = client.limits("m")
    assert learned.context_limit == (limit or 0)
    assert learned.ratio == (min(4.0, prompt / 1_000) if prompt else 1.0)


PARAMETER_REFUSALS = {
    "vLLM without auto tool choice": (
        {"message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'},
        "tool_choice",
        None,
    ),
    "pydantic extra input": (
        {"message": "1 validation error: ('body', 'tool_choice') Extra inputs are not permitted"},
        "tool_choice",
        None,
    ),
    "llama-server without --jinja": ({"code": 400, "message": "tools param requires --jinja flag"}, "tools", None),
    "OpenAI reasoning model": (
        {
            "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            "param": "max_tokens",
        },
        "max_tokens",
        "max_completion_tokens",
    ),
}


@pytest.mark.parametrize("server", list(PARAMETER_REFUSALS))
async def test_a_refused_parameter_is_not_sent_again(server: str, llm_server: FakeLLMServer) -> None:
    error, refused, instead = PARAMETER_REFUSALS[server]
    llm_server.script(fault_status(400, {"error": error}), reply_text("fine"), reply_text("again"))
    client = LLMClient("m", api_key="k", base_url=llm_server.base_url, max_retries=0)
    try:
        assert (await client.complete(Request(HI, TOOLS, max_tokens=100))).content == "fine"
        assert (await client.complete(Request(HI, TOOLS, max_tokens=100))).content == "again"
    finally:
        await client.close()
    first, *later = llm_server.requests
    assert refused in first and all(refused not in body for body in later)
    if instead:
        assert all(body[instead] == 100 for body in later)
    if refused != "tools":
        assert all(body["tools"] == TOOLS for body in later)  # only the parameter goes
    else:
        assert all("tool_choice" not in body for body in later)


async def test_an_outage_is_no_refusal(llm_server: FakeLLMServer) -> None:
    # A 500 that does not speak of the request is retried by the client, never "repaired".
    llm_server.script(fault_status(500, {"error": {"message": "CUDA out of memory"}}, {"retry-after-ms": "1"}))
    llm_server.script(reply_text("back"))
    client = LLMClient("m", api_key="k", base_url=llm_server.base_url, max_retries=1)
    try:
        assert (await client.complete(Request([{"role": "assistant", "content": None}, *HI]))).content == "back"
    finally:
        await client.close()
    assert json.loads(llm_server.raw_requests[0].raw_body)["messages"][0]["content"] == ""
    assert len(llm_server.requests) == 2 and llm_server.requests[0] == llm_server.requests[1]


async def test_a_refusal_no_repair_lifts_is_one_clear_error(llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(lambda request: fault_status(400, {"error": {"message": "Invalid request: bad"}}))
    client = LLMClient("m", api_key="k", base_url=llm_server.base_url, max_retries=0)
    try:
        with pytest.raises(LLMUnavailableError) as caught:
            await client.complete(Request([{"role": "system", "content": "s"}, *HI, *CALL, *HI]))
    finally:
        await client.close()
    assert "refused my request" in caught.value.user_message and "saved" in caught.value.user_message
    # The request as it was, then its calls as text (merged), then the newest message alone.
    assert [len(body["messages"]) for body in llm_server.requests] == [5, 4, 2]
    assert llm_server.requests[1]["messages"][2] == {"role": "assistant", "content": "[I called f({})]"}
