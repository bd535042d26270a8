"""What a person gets from a small self-hosted server, shown on the scripted one
(tests/fake_llm.py), without real servers (tests/test_real_servers.py has them):

- answers are streamed and read only to the reply budget: a server that writes
  past `max_tokens` (llama-cpp-python's chatml-function-calling) is cut off, its
  connection closed, and no longer eats the message's time budget;
- a server that refuses streaming is asked without it (and its usage still read), and
  a stream that stops short of its answer is asked again without streaming;
- the usage comes from the stream's last event, the cached share from
  `prompt_tokens_details` or llama-server's `timings`;
- a server whose chat template drops the functions is named once, with the fix,
  in the log and in `memgpt-bot chat`;
- a step's call a stream could not carry, or an answer a tool grammar left without
  words (llama-cpp-python's chatml-function-calling), is asked for by name, streamed;
  there, a failed chain's last request is the step's own with send_message named (its
  prompt cache serves it), the plain one after it only if the name was not kept to.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.llm import LLMClient, Request
from bot.llm.types import StreamedAnswer, one_per_piece, parse_completion, reply_budget
from memory.tokens import TokenCounter, load_encoder
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, Reply, RunawayReply, fault_delay, reply_text, reply_tool_calls, say, tool_call
from tests.helpers import said
from tests.test_cli import base_env, memgpt

COUNTER = TokenCounter(load_encoder("test-model"))
HI = [{"role": "user", "content": "hi"}]
DROPPED = "left the functions out of the prompt"


def client_for(server: FakeLLMServer) -> LLMClient:
    return LLMClient("m", api_key="k", base_url=server.base_url, timeout=10, max_retries=0)


async def test_a_runaway_answer_is_cut_at_the_reply_budget_and_its_connection_closed(
    llm_server: FakeLLMServer,
) -> None:
    runaway = RunawayReply(piece="la la ")
    llm_server.script(runaway)
    client = client_for(llm_server)
    try:
        started = time.monotonic()
        completion = await client.complete(Request(HI, max_tokens=40, count_tokens=COUNTER.count))
    finally:
        await client.close()
    assert completion.finish_reason == "length"
    # Not before max_tokens (where the server would have stopped), nor a piece past the budget
    # (counted piece by piece, a little over the whole text's count).
    read = COUNTER.count(completion.content or "")
    assert 40 <= read <= reply_budget(40) + COUNTER.count("la la "), read
    assert runaway.closed.wait(5), "the server went on writing: the connection was not closed"
    assert runaway.pieces[0] < 200 and time.monotonic() - started < 5


async def test_a_runaway_server_leaves_time_for_an_answer(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # llama-cpp-python writing a call's arguments to the end of its context on every
    # step: the person got "not answering in time" after the whole budget.
    llm_server.set_handler(
        lambda request: RunawayReply(piece="x ", arguments=True) if request.get("tools") else reply_text("Hi Dana!")
    )
    runtime = await make_runtime(max_steps_per_event=2, message_time_budget=60.0)
    started = time.monotonic()
    result = await runtime.handle_with_details(said("I'm Dana"))
    assert [reply.text for reply in result.replies] == ["Hi Dana!"] and result.trouble is None
    assert time.monotonic() - started < 20
    steps = [request for request in llm_server.requests if request.get("tools")]
    assert len(steps) == 2 and all(request["stream"] for request in steps)


async def test_a_server_that_refuses_streaming_is_asked_without_it(llm_server: FakeLLMServer) -> None:
    llm_server.streaming = False
    usage = {"prompt_tokens": 321, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 300}}
    llm_server.script(reply_text("one", usage=usage), reply_text("two", usage=usage))
    client = client_for(llm_server)
    try:
        first = await client.complete(Request(HI, max_tokens=16))
        second = await client.complete(Request(HI, max_tokens=16))
    finally:
        await client.close()
    assert [first.content, second.content] == ["one", "two"]
    assert first.usage.prompt == 321 and first.usage.cached == 300
    sent = llm_server.requests
    # Refused once, repaired, and the endpoint remembers: the next request goes without.
    streamed = [("stream" in body, "stream_options" in body) for body in sent]
    assert streamed == [(True, True), (False, False), (False, False)]


async def test_the_usage_is_read_from_the_streams_last_event(llm_server: FakeLLMServer) -> None:
    usage = {"prompt_tokens": 500, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 480}}
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "hello"}), usage=usage))
    client = client_for(llm_server)
    try:
        completion = await client.complete(Request(HI, max_tokens=64))
    finally:
        await client.close()
    assert llm_server.requests[0]["stream_options"] == {"include_usage": True}
    assert (completion.usage.prompt, completion.usage.cached) == (500, 480)
    assert [(call.name, json.loads(call.arguments)) for call in completion.tool_calls] == [
        ("send_message", {"message": "hello"})
    ]


def test_llama_servers_timings_give_the_cached_share() -> None:
    answer = StreamedAnswer(0, one_per_piece)
    answer.add({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]})
    answer.add(
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 1},
            "timings": {"cache_n": 850, "prompt_n": 50},
        }
    )
    completion = parse_completion(answer.body())
    assert (completion.content, completion.usage.prompt, completion.usage.cached) == ("Hi", 900, 850)


def template_without_tools(request: dict[str, object]) -> Reply:
    """A server whose chat template renders no tools: its count is of the messages alone."""
    messages = request.get("messages")
    prompt = COUNTER.count_request(messages if isinstance(messages, list) else [])
    return reply_text("(none yet)", usage={"prompt_tokens": prompt, "completion_tokens": 3})


async def test_functions_the_server_left_out_are_named_once_with_the_fix(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.set_handler(template_without_tools)
    runtime = await make_runtime(max_steps_per_event=2)
    with caplog.at_level(logging.WARNING):
        for text in ("I'm Dana", "I have a cat", "What is my name?"):
            result = await runtime.handle_with_details(said(text))
            # The model's echo of the prompt is never the answer.
            assert all("(none yet)" not in reply.text for reply in result.replies)
    notes = [record.getMessage() for record in caplog.records if DROPPED in record.getMessage()]
    assert len(notes) == 1 and "chat template" in notes[0] and "--jinja" in notes[0], notes
    assert runtime.llm.endpoint.tools_dropped


async def test_a_server_that_calls_functions_is_never_named(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A call was made: the template renders the tools, whatever its token counts.
    llm_server.script(say("Hello!"))
    llm_server.set_handler(template_without_tools)
    runtime = await make_runtime(max_steps_per_event=2)
    with caplog.at_level(logging.WARNING):
        for text in ("hi", "I'm Dana"):
            await runtime.handle(said(text))
    assert not [record for record in caplog.records if DROPPED in record.getMessage()]
    assert not runtime.llm.endpoint.tools_dropped


def test_memgpt_chat_names_the_dropped_functions_once(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.set_handler(template_without_tools)
    env = base_env(llm_server.base_url, tmp_path / "data", MEMGPT_MAX_STEPS="2")
    result = memgpt("chat", "--user", "dana", env=env, cwd=tmp_path, stdin="I'm Dana\nWhat is my name?\n")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(DROPPED) == 1, result.stderr
    assert "(none yet)" not in result.stdout


@dataclass(frozen=True)
class StreamThatStops(Reply):
    """llama-cpp-python's chatml-function-calling asked to stream a function call: it
    raises after the first event, and the stream ends without the answer."""

    def respond(self, h: Any, request: dict[str, Any]) -> None:
        h.start_events()
        h.send_event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
        h.wfile.write(b"0\r\n\r\n")


async def test_a_stream_that_stops_short_is_asked_again_without_streaming(llm_server: FakeLLMServer) -> None:
    llm_server.script(StreamThatStops(), reply_tool_calls(tool_call("send_message", {"message": "hello"})))
    client = client_for(llm_server)
    try:
        completion = await client.complete(Request(HI, max_tokens=64))
    finally:
        await client.close()
    assert [call.name for call in completion.tool_calls] == ["send_message"]
    assert [body.get("stream", False) for body in llm_server.requests] == [True, False]


async def test_a_step_out_of_time_still_leaves_a_plain_text_answer(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # A slow server is no server that is down: the rest of the message's time asks for plain text.
    llm_server.script(fault_delay(3, say("too late")), reply_text("Here now."))
    runtime = await make_runtime(llm_timeout=1, llm_max_retries=0, message_time_budget=30.0)
    result = await runtime.handle_with_details(said("hello"))
    assert [reply.text for reply in result.replies] == ["Here now."] and result.trouble is None
    assert "tools" not in llm_server.requests[-1]


# llama-cpp-python 0.3.36's chatml-function-calling (bot/llm/named_calls.py).
SEND = {"type": "function", "function": {"name": "send_message", "parameters": {"type": "object"}}}
SAVE = {"type": "function", "function": {"name": "core_memory_append", "parameters": {"type": "object"}}}
NAMED_SEND = {"type": "function", "function": {"name": "send_message"}}


@dataclass(frozen=True)
class NoWordsNoUsage(Reply):
    """Its answer when the model chose "message:": the message grammar allows only the end, and
    its stream carries no usage (it ignores stream_options)."""

    def respond(self, h: Any, request: dict[str, Any]) -> None:
        h.send_events(
            [
                {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
        )


@dataclass(frozen=True)
class NamedCallStream(Reply):
    """A named tool_choice, streamed: the whole name again in every chunk, and no usage."""

    pieces: tuple[str, ...] = ('{"message": ', '"Hi Dana"}')

    def respond(self, h: Any, request: dict[str, Any]) -> None:
        name = request["tool_choice"]["function"]["name"]
        calls = [
            {"index": 0, "id": "c1", "type": "function", "function": {"name": name, "arguments": p}}
            for p in self.pieces
        ]
        events = [{"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]} for call in calls]
        h.send_events([*events, {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}])


def step(*tools: dict[str, Any]) -> Request:
    return Request(HI, list(tools), max_tokens=64, count_tokens=COUNTER.count)


async def test_an_answer_without_words_is_asked_again_with_the_answer_function_named(
    llm_server: FakeLLMServer,
) -> None:
    llm_server.script(NoWordsNoUsage(), NamedCallStream())
    client = client_for(llm_server)
    try:
        completion = await client.complete(step(SAVE, SEND))
    finally:
        await client.close()
    assert [(call.name, call.arguments) for call in completion.tool_calls] == [
        ("send_message", '{"message": "Hi Dana"}')
    ]
    first, named = llm_server.requests
    assert first["tool_choice"] == "auto" and named["tool_choice"] == NAMED_SEND
    assert named["stream"] and named["max_tokens"] == 64 and named["messages"] == first["messages"]


async def test_a_call_its_stream_could_not_carry_is_named_in_a_few_tokens_then_streamed(
    llm_server: FakeLLMServer,
) -> None:
    # The model chose core_memory_append: the stream stops; not streamed, stop strings cut the
    # arguments at their start and the choice after them, so only the name comes back.
    llm_server.script(
        StreamThatStops(), reply_tool_calls(tool_call("core_memory_append", "")), NamedCallStream(('{"a": 1}',))
    )
    client = client_for(llm_server)
    try:
        completion = await client.complete(step(SEND, SAVE))
    finally:
        await client.close()
    assert [(call.name, call.arguments) for call in completion.tool_calls] == [("core_memory_append", '{"a": 1}')]
    streamed, name_only, named = llm_server.requests
    assert streamed["stream"] and "stream" not in name_only and name_only["stop"] == ["{", "functions"]
    assert name_only["tool_choice"] == "auto" and named["stream"]
    assert named["tool_choice"] == {"type": "function", "function": {"name": "core_memory_append"}}


async def test_an_empty_answer_with_usage_is_no_grammar_s_doing(llm_server: FakeLLMServer) -> None:
    # A server that streams its usage answered "" on purpose: nothing is asked by name.
    llm_server.script(reply_text(""))
    client = client_for(llm_server)
    try:
        completion = await client.complete(step(SEND))
    finally:
        await client.close()
    assert not completion.content and not completion.tool_calls and len(llm_server.requests) == 1


def chatml_function_calling(request: dict[str, Any]) -> Reply:
    """A model that saves the same fact step after step (a function loop), on llama-cpp-python's
    chatml-function-calling: a chosen function breaks the stream, the name comes unstreamed, the
    arguments streamed by name; a request without tools gets plain text."""
    if not request.get("tools"):
        return reply_text("Plain.")
    if "stream" not in request:
        return reply_tool_calls(tool_call("core_memory_append", ""))
    if request["tool_choice"] == "auto":
        return StreamThatStops()
    if request["tool_choice"] == NAMED_SEND:
        return NamedCallStream(('{"message": "Hi Dana"}',))
    return NamedCallStream(('{"name": "human", "content": "Dana.", "request_heartbeat": true}',))


async def test_where_named_calls_stream_a_failed_chain_ends_with_send_message_named(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # A request without the functions renders another prompt after the system text: the
    # server evaluated all ~4,000 tokens again (145 s). The step's own request, send_message
    # named, is served from its prompt cache.
    llm_server.set_handler(chatml_function_calling)
    runtime = await make_runtime()
    result = await runtime.handle_with_details(said("I'm Dana"))
    assert [reply.text for reply in result.replies] == ["Hi Dana"] and result.looped
    *steps, last = llm_server.requests
    assert last["tool_choice"] == NAMED_SEND and last["stream"] and last["tools"] == steps[-1]["tools"]
    # The last step's prompt, as it was (the repeated call was not run), its status line apart.
    assert last["messages"][:-1] == steps[-1]["messages"][:-1]


async def test_a_server_that_ignores_the_name_still_gets_the_plain_request(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # Named calls came back streamed on steps, but the last request's name was not kept to:
    # the request without the functions follows, and its text is the answer.
    def ignores_send_message(request: dict[str, Any]) -> Reply:
        if request.get("tool_choice") == NAMED_SEND:
            return reply_tool_calls(tool_call("core_memory_append", {"name": "human", "content": "Dana."}))
        return chatml_function_calling(request)

    llm_server.set_handler(ignores_send_message)
    runtime = await make_runtime()
    result = await runtime.handle_with_details(said("I'm Dana"))
    assert [reply.text for reply in result.replies] == ["Plain."] and result.trouble is None
    assert llm_server.requests[-2]["tool_choice"] == NAMED_SEND and "tools" not in llm_server.requests[-1]


async def test_once_named_calls_stream_a_steps_choice_is_asked_by_name_at_once(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # The streamed choice of every step after the first took seconds of generation on
    # llama-cpp-python and carried nothing: once a named call came back, it is not sent.
    llm_server.set_handler(chatml_function_calling)
    runtime = await make_runtime()
    await runtime.handle_with_details(said("I'm Dana"))
    streamed_choices = [r for r in llm_server.requests if r.get("tool_choice") == "auto" and "stream" in r]
    assert len(streamed_choices) == 1 and llm_server.requests[0] is streamed_choices[0]
    requests_before = len(llm_server.requests)
    result = await runtime.handle_with_details(said("I live in Lisbon"))
    later = llm_server.requests[requests_before:]
    assert [reply.text for reply in result.replies] == ["Hi Dana"]
    assert later and not [r for r in later if r.get("tool_choice") == "auto" and "stream" in r]
    assert "stream" not in later[0] and later[0]["stop"] == ["{", "functions"]
