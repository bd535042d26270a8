"""The agent against real OpenAI-compatible servers with a real model:
llama.cpp's `llama-server` and llama-cpp-python's server, each serving
SmolLM2-135M-Instruct with tool calling on (tests/real_llm_servers.py), with a
context of 2,560 tokens.

They check protocol and resilience, not wisdom: every message gets a reply,
no agent stays broken, no request goes over the server's own context, usage is
recorded, and (on llama-server) an LLM server killed mid-message, then a bot restart, recovers.
What the bot sent and what the server answered are read from a recording proxy
between them. Without the servers built (scripts/install_llama_server.sh,
scripts/install_llama_cpp_python.sh, scripts/install_smollm2.sh; `.ci/run`
runs them) the tests skip with the reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.agent import EventResult
from bot.config import Settings
from bot.events import UserMessage
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.tokens import TokenCounter, load_encoder
from tests.forks import run_cli
from tests.real_llm_servers import (
    MODEL_ALIAS,
    SERVER_KINDS,
    RealServer,
    RecordingProxy,
    bot_environment,
    null_contents,
    over_context,
    prompt_counts,
    refused,
    server_or_skip,
)

CONTEXT = 2560
USER = "dana"
# A weak model may chain a few steps per message; the cap keeps the tests short.
MAX_STEPS = "2"
MESSAGE_TIMEOUT = 600.0  # generous: a busy 2-core machine, a CPU model


@pytest.fixture(params=SERVER_KINDS)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[RealServer, RecordingProxy]]:
    server = server_or_skip(request.param, CONTEXT)
    proxy = RecordingProxy(server.port)
    try:
        yield server, proxy
    finally:
        proxy.close()
        server.stop()


async def open_runtime(proxy: RecordingProxy, data_dir: Path, embedder: Embedder) -> Runtime:
    env = bot_environment(proxy.base_url, data_dir, CONTEXT, MEMGPT_MAX_STEPS=MAX_STEPS)
    return await Runtime.create(Settings.from_mapping(env), embedder=embedder)


async def say(runtime: Runtime, text: str) -> EventResult:
    event = UserMessage(platform="terminal", user_id=USER, text=text)
    return await asyncio.wait_for(runtime.handle_with_details(event), MESSAGE_TIMEOUT)


def replied(result: EventResult, text: str, server: RealServer) -> str:
    said = " ".join(reply.text for reply in result.replies).strip()
    assert said, f"no reply to {text!r} (steps {result.steps}); server log:\n{server.log_tail()}"
    return said


def the_server_answered(proxy: RecordingProxy, since: int, server: RealServer) -> None:
    """The message's turn reached the model and the server answered it: the agent
    is not broken. (What the tiny model made of it is not checked: it may chain
    calls to the step cap, and the person then gets an honest line.)"""
    exchanges = proxy.completions(since)
    assert any(exchange.status == 200 for exchange in exchanges), (
        f"no request of this message succeeded: {[(e.status, e.error[:200]) for e in exchanges]}\n"
        f"server log:\n{server.log_tail()}"
    )


async def test_a_conversation_is_answered_within_the_servers_context(
    served: tuple[RealServer, RecordingProxy], embedder: Embedder, tmp_path: Path
) -> None:
    server, proxy = served
    context = server.context_size()
    assert context == CONTEXT
    runtime = await open_runtime(proxy, tmp_path / "data", embedder)
    messages = [
        "Hi! I'm Dana, I live in Lisbon and I work as a nurse.",
        "My order number is 4815162342 and my sister Ines turns 31 on 14 March.",
        "What is my name, and where do I live?",
    ]
    try:
        for text in messages:
            since = len(proxy.exchanges)
            result = await say(runtime, text)
            replied(result, text, server)
            the_server_answered(proxy, since, server)
    finally:
        await runtime.close(close_embedder=False)

    completions = proxy.completions()
    assert not over_context(completions, server), [(e.status, e.usage, e.error[:300]) for e in completions]
    assert not null_contents(completions)  # refused by llama-cpp-python's schema
    # A refusal may happen once and be repaired; the same refusal for every message would be a broken agent.
    assert len(refused(completions)) < len(messages), [(e.status, e.error[:300]) for e in refused(completions)]
    # The server reports its own usage on every answer, of the size of what was sent.
    counts = prompt_counts(completions, TokenCounter(load_encoder(MODEL_ALIAS)))
    assert 0.5 * counts.messages < counts.server < 3 * counts.with_tools, counts

    # Usage is recorded with the daily budget off (MEMGPT_DAILY_TOKEN_BUDGET=0).
    env = bot_environment(proxy.base_url, tmp_path / "data", CONTEXT)
    shown = run_cli(["limits", "show", USER, "--json"], env=env, cwd=tmp_path, stdin=None, timeout=120)
    assert shown.returncode == 0, shown.stderr
    usage = json.loads(shown.stdout)
    assert usage["tokens_today"] > 0, usage
    assert sum(day["prompt"] for day in usage["tokens_by_day"]) > 0, usage


# Recovery is the bot's side of a dropped connection and a restart: one real server
# shows it (llama-cpp-python's run of it cost 110-120 CPU-seconds on a busy machine,
# a sixth of the suite); the conversation above runs on both.
@pytest.mark.parametrize("served", ["llama-server"], indirect=True)
async def test_a_server_killed_mid_message_and_a_bot_restart_recover(
    served: tuple[RealServer, RecordingProxy], embedder: Embedder, tmp_path: Path
) -> None:
    server, proxy = served
    data_dir = tmp_path / "data"
    runtime = await open_runtime(proxy, data_dir, embedder)
    try:
        since = len(proxy.exchanges)
        result = await say(runtime, "Hello, I'm Dana. I grow tomatoes on my balcony.")
        replied(result, "first", server)
        the_server_answered(proxy, since, server)

        # The server dies while it works on the next message: the person still gets a reply.
        proxy.request_seen.clear()
        pending = asyncio.create_task(say(runtime, "Which vegetables are easy to grow in pots?"))
        assert await asyncio.to_thread(proxy.request_seen.wait, MESSAGE_TIMEOUT)
        server.kill()
        replied(await pending, "second", server)
    finally:
        await runtime.close(close_embedder=False)

    # The server comes back, the bot restarts on the same data: the agent answers again.
    server.start()
    runtime = await open_runtime(proxy, data_dir, embedder)
    try:
        since = len(proxy.exchanges)
        result = await say(runtime, "Do you remember what I grow?")
        replied(result, "third", server)
        the_server_answered(proxy, since, server)
    finally:
        await runtime.close(close_embedder=False)
    assert not over_context(proxy.completions(), server)
