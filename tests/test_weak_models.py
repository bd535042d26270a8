"""Small local models still answer: their plain text, their near-miss calls, and a
person's message never ending in silence or "stuck". The openai client's own
loggers are held to warnings."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import openai

from bot.agent import NO_ANSWER
from bot.agent_calls import PLAIN_ANSWER_REQUEST
from bot.function_loops import FAILED_STEPS_IN_A_ROW
from cli import logs
from memory.types import Passage
from tests.conftest import RuntimeFactory, make_settings
from tests.fake_llm import CompletionReply, FakeLLMServer, reply_text, reply_tool_calls, tool_call
from tests.helpers import said

HEARTBEAT_CALL = tool_call("core_memory_append", {"name": "human", "content": "Likes tea.", "request_heartbeat": True})


def steps_so_far(request: dict[str, Any]) -> int:
    """The steps the chain took before this request: one function result each."""
    return sum(1 for message in request["messages"] if message["role"] == "tool")


def blocks_that_are_not_there(request: dict[str, Any]) -> CompletionReply:
    """SmolLM2's core_memory_append on a block named after a word of the message, another at
    every step, always failing with the same error (the name aside); "Hello Dana." in plain text."""
    if not request.get("tools"):
        return reply_text("Hello Dana.")
    arguments = {"name": f"dana{len(request['messages'])}", "content": "Dana.", "request_heartbeat": True}
    return reply_tool_calls(tool_call("core_memory_append", arguments))


def another_fact(request: dict[str, Any]) -> CompletionReply:
    """A memory call with a heartbeat, its arguments new at every step (no function loop)."""
    fact = f"Likes tea ({len(request['messages'])})."
    arguments = {"name": "human", "content": fact, "request_heartbeat": True}
    return reply_tool_calls(tool_call("core_memory_append", arguments))


async def test_the_step_cap_sends_the_models_own_text(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.script(
        reply_tool_calls(HEARTBEAT_CALL),
        reply_text("You like tea, I will remember that."),  # in the chain: nudged, kept
    )
    llm_server.set_handler(another_fact)
    runtime = await make_runtime(max_steps_per_event=4)
    result = await runtime.handle_with_details(said("I like tea"))
    assert result.hit_step_cap and result.trouble is None
    assert [r.text for r in result.replies] == ["You like tea, I will remember that."]
    assert all("stuck" not in r.text for r in result.replies)


async def test_a_function_loop_ends_the_chain_at_once(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    # SmolLM2 through llama-cpp-python made the same call with the same arguments step after
    # step, to the step cap; the repeat is not run, and the last request answers.
    llm_server.set_handler(
        lambda request: reply_tool_calls(HEARTBEAT_CALL) if request.get("tools") else reply_text("Tea, noted.")
    )
    runtime = await make_runtime(max_steps_per_event=8)
    result = await runtime.handle_with_details(said("I like tea"))
    assert [r.text for r in result.replies] == ["Tea, noted."] and result.trouble is None
    assert result.looped and not result.hit_step_cap and result.steps == 2
    assert [bool(request.get("tools")) for request in llm_server.requests] == [True, True, False]
    agent = await runtime.agent("terminal:alice")
    assert agent.working_context.get("human").value.count("Likes tea.") == 1  # run once


async def test_a_function_failing_again_with_the_same_error_ends_the_chain(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # SmolLM2 through llama-cpp-python: core_memory_append on a block named after a word of
    # the message, failing, then again on another, eight steps of three requests a message.
    # The second error says what the first did (the values it quotes aside): the model did
    # not act on it, so a third try would be no better.
    llm_server.set_handler(blocks_that_are_not_there)
    runtime = await make_runtime(max_steps_per_event=8)
    result = await runtime.handle_with_details(said("I'm Dana"))
    assert [r.text for r in result.replies] == ["Hello Dana."] and result.trouble is None
    assert result.looped and result.steps == 2
    assert [bool(request.get("tools")) for request in llm_server.requests] == [True, True, False]


async def test_after_a_chain_that_looped_the_next_ends_at_its_first_failure(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # SmolLM2 on llama-cpp-python looped on every message, two requests a failed step: a model
    # that looped once loses its retries until one of its chains ends by itself.
    runtime = await make_runtime(max_steps_per_event=8)
    steps = []
    for handler in [blocks_that_are_not_there, blocks_that_are_not_there, None, blocks_that_are_not_there]:
        llm_server.set_handler(handler)
        if handler is None:
            llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "Hi again."})))
        result = await runtime.handle_with_details(said("I'm Dana"))
        assert result.trouble is None and result.replies
        steps.append((result.steps, result.looped))
    # Two failed steps (the same error again), then one, then a chain that ends by itself, then two.
    assert steps == [(2, True), (1, True), (1, False), (2, True)]


async def test_a_function_that_keeps_failing_ends_the_chain(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # Each error another than the last (a model acting on what it was told, wrongly again):
    # it keeps its retries until FAILED_STEPS_IN_A_ROW, then the chain ends, not at the step cap.
    def new_mistakes(request: dict[str, Any]) -> CompletionReply:
        if not request.get("tools"):
            return reply_text("Hello Dana.")
        steps = steps_so_far(request)
        block, content = ("human", "") if steps % 2 else (f"dana{steps}", "Dana.")
        arguments = {"name": block, "content": content, "request_heartbeat": True}
        return reply_tool_calls(tool_call("core_memory_append", arguments))

    llm_server.set_handler(new_mistakes)
    runtime = await make_runtime(max_steps_per_event=8)
    result = await runtime.handle_with_details(said("I'm Dana"))
    assert [r.text for r in result.replies] == ["Hello Dana."] and result.trouble is None
    assert result.looped and result.steps == FAILED_STEPS_IN_A_ROW < 8
    assert [bool(request.get("tools")) for request in llm_server.requests] == [True] * FAILED_STEPS_IN_A_ROW + [False]


async def test_a_search_that_finds_nothing_new_ends_the_chain(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # SmolLM2 through llama-cpp-python searched archival storage with a garbled query at every
    # step, to the step cap: each search showed the same passages. The second search that
    # finds what the first found ends the chain; a page of new hits does not.
    def garbled_searches(request: dict[str, Any]) -> CompletionReply:
        if not request.get("tools"):
            return reply_text("Your dog is Rex.")
        steps = steps_so_far(request)
        arguments = {"query": f"dog {'x' * steps}", "page": 0, "request_heartbeat": True}
        return reply_tool_calls(tool_call("archival_memory_search", arguments))

    llm_server.set_handler(garbled_searches)
    runtime = await make_runtime(max_steps_per_event=8)
    agent = await runtime.agent("terminal:alice")
    await agent.save_passages([Passage("Alice's dog is called Rex.")])
    result = await runtime.handle_with_details(said("What is my dog called?"))
    assert [r.text for r in result.replies] == ["Your dog is Rex."] and result.trouble is None
    assert result.looped and result.steps == 2
    assert [bool(request.get("tools")) for request in llm_server.requests] == [True, True, False]


async def test_searches_that_page_on_keep_the_chain(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    # Each page shows other passages: the model learns something at every step.
    def paging(request: dict[str, Any]) -> CompletionReply:
        steps = steps_so_far(request)
        if steps == 3:
            return reply_tool_calls(tool_call("send_message", {"message": "Rex, Fido and Tom."}))
        arguments = {"query": "dog", "page": steps, "request_heartbeat": True}
        return reply_tool_calls(tool_call("archival_memory_search", arguments))

    llm_server.set_handler(paging)
    runtime = await make_runtime(max_steps_per_event=8, search_page_size=1)
    agent = await runtime.agent("terminal:alice")
    texts = ["Alice's dog is called Rex.", "Bob's dog is called Fido.", "Carol's dog is called Tom."]
    await agent.save_passages([Passage(text) for text in texts])
    result = await runtime.handle_with_details(said("Whose dogs do you know?"))
    assert [r.text for r in result.replies] == ["Rex, Fido and Tom."]
    assert not result.looped and result.steps == 4


SILENT_CALL = tool_call("core_memory_append", {"name": "human", "content": "Likes tea.", "request_heartbeat": False})


async def test_a_chain_ending_without_a_reply_asks_once_for_plain_text(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # A memory call without a heartbeat ends the chain: the person got nothing at all.
    llm_server.script(reply_tool_calls(SILENT_CALL), reply_text("Noted: you like tea."))
    runtime = await make_runtime()
    result = await runtime.handle_with_details(said("I like tea"))
    assert [r.text for r in result.replies] == ["Noted: you like tea."] and result.trouble is None
    # The last request offers no functions, and carries none of their calls or results.
    last = llm_server.requests[-1]
    assert len(llm_server.requests) == 2 and "tools" not in last and "tool_choice" not in last
    assert all(m["role"] in ("system", "user", "assistant") and "tool_calls" not in m for m in last["messages"])
    # The instruction in the system message, the person's message last (a small model answers the newest turn).
    assert PLAIN_ANSWER_REQUEST in last["messages"][0]["content"] and "I like tea" in last["messages"][-1]["content"]
    assert "core_memory_append" in json.dumps(last["messages"])  # the call, written out as text
    # The answer is kept as the model's: the next message's request shows it.
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "Tea it is."})))
    await runtime.handle(said("and coffee?"))
    assert any(m.get("content") == "Noted: you like tea." for m in llm_server.requests[-1]["messages"])


async def test_a_plain_answer_that_echoes_the_prompt_gets_an_honest_note(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # SmolLM2 through llama-server copied "(none yet)" (the empty summary) as its answer.
    llm_server.script(reply_tool_calls(SILENT_CALL), reply_text("(none yet)"))
    runtime = await make_runtime()
    result = await runtime.handle_with_details(said("I like tea"))
    assert [r.text for r in result.replies] == [NO_ANSWER]
    assert "saved" in NO_ANSWER and "try again" in NO_ANSWER and "stuck" not in NO_ANSWER


async def test_calls_with_one_obvious_meaning_are_repaired(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    nested = json.dumps(json.dumps({"name": "human", "content": "Has a dog.", "request_heartbeat": True}))
    llm_server.script(
        reply_tool_calls(
            tool_call(" core_memory_append ", nested),  # stray spaces; a JSON string inside the string
            tool_call("`archival_memory_insert`", {"content": "The dog is called Rex."}),  # no request_heartbeat
        ),
        reply_tool_calls(tool_call("functions.send_message", {"message": "Rex!"})),
    )
    runtime = await make_runtime()
    replies = await runtime.handle(said("my dog is Rex"))
    assert [r.text for r in replies] == ["Rex!"]
    results = [json.loads(m["content"]) for m in llm_server.requests[1]["messages"] if m["role"] == "tool"]
    assert [r["status"] for r in results[-2:]] == ["OK", "OK"], results
    agent = await runtime.agent("terminal:alice")
    assert "Has a dog." in agent.working_context.get("human").value


async def test_plain_text_echoing_the_systems_alerts_is_not_sent(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # SmolLM2 through llama-server answered "[system alert] [memory pressure] ..." as plain text.
    llm_server.script(
        reply_text("[system alert] [memory pressure] Your context is 80% full."),
        reply_tool_calls(tool_call("send_message", {"message": "Hello!"})),
    )
    runtime = await make_runtime()
    replies = await runtime.handle(said("hi"))
    assert [r.text for r in replies] == ["Hello!"]
    assert len(llm_server.requests) == 2  # nudged to answer with send_message


async def test_the_openai_clients_request_log_is_held_to_warnings(tmp_path: Path, llm_server: FakeLLMServer) -> None:
    llm_server.script(reply_text("one"), reply_text("two"))
    path = logs.configure_logging(make_settings(tmp_path), verbose=False)
    client = openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0)
    root = logging.getLogger()
    try:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert "HTTP Request" not in path.read_text()
        # The name is the one the client really logs through: at INFO it shows every request.
        logging.getLogger("httpx2").setLevel(logging.INFO)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert "httpx2: HTTP Request: POST" in path.read_text()
    finally:
        await client.close()
        logging.getLogger("httpx2").setLevel(logging.WARNING)
        for handler in logs._handlers:
            root.removeHandler(handler)
            handler.close()
        logs._handlers.clear()


async def test_the_lines_of_an_answer_that_echo_the_prompt_are_cut(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # SmolLM2 through llama-server: a message's transcript head, the empty summary in
    # another case, a line of the memory status, and punctuation alone around its words.
    echoing = "[2026-12-07 17:44 UTC] user: Hello Dana!\n(None yet)\n[memory status] memory 5% full\n```\nNice to meet."
    llm_server.script(reply_text(echoing))
    runtime = await make_runtime()
    replies = await runtime.handle(said("I'm Dana"))
    assert [r.text for r in replies] == ["Hello Dana!\nNice to meet."]


async def test_an_empty_answer_goes_straight_to_the_plain_text_request(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # llama-cpp-python's chatml-function-calling answers "" whenever its model does not call
    # a function: nudging it again only gets "" again, step after step.
    llm_server.script(reply_text(""), reply_text("Hello Dana."))
    runtime = await make_runtime()
    replies = await runtime.handle(said("I'm Dana"))
    assert [r.text for r in replies] == ["Hello Dana."]
    assert [bool(request.get("tools")) for request in llm_server.requests] == [True, False]


def test_a_debug_log_says_it_keeps_what_people_write(tmp_path: Path) -> None:
    # Forgetting cannot reach a log file: at DEBUG, where the chat libraries log whole
    # payloads, the operator is told so, in the log and on the console.
    root = logging.getLogger()
    try:
        path = logs.configure_logging(make_settings(tmp_path, log_level="DEBUG"), verbose=False)
        assert "forgetting does not reach it" in path.read_text()
        path = logs.configure_logging(make_settings(tmp_path / "info"), verbose=False)
        assert "forgetting does not reach it" not in path.read_text()
    finally:
        for handler in logs._handlers:
            root.removeHandler(handler)
            handler.close()
        logs._handlers.clear()
