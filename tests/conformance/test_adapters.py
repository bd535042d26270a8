"""The adapter conformance suite: what every chat platform must do, tested once
and run over each platform (tests/chat_platforms.py), like the store suite runs
over each storage backend.

Each test starts `memgpt-bot run` as its own process against a stand-in for the
platform's servers, through the platform's real client library (slack-bolt and
slack-sdk in Socket Mode against tests/fake_slack.py; discord.py's gateway, with
zlib-stream, and HTTP against tests/fake_discord.py), and the local LLM server
(tests/fake_llm.py). Nothing here touches adapter internals: only what a person
sends, what the platform received, what the model was sent, and the process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chat_platforms import PLATFORMS, BotProcess, ChatPlatform, open_platform
from tests.fake_llm import FakeLLMServer, Reply
from tests.test_places_e2e import CODEWORD, story_model

WITHIN = 90.0  # outer limits for a busy machine: every wait ends as soon as its event happens
PROMPT_EXIT = 20.0  # seconds from SIGTERM to exit, with nothing in flight


@pytest.fixture(params=PLATFORMS)
def platform(request: pytest.FixtureRequest) -> Iterator[ChatPlatform]:
    yield from open_platform(request.param)


@pytest.fixture
def bot(platform: ChatPlatform, llm_server: FakeLLMServer, tmp_path: Path) -> Iterator[BotProcess]:
    llm_server.set_handler(story_model)
    process = BotProcess(platform, llm_server.base_url, tmp_path)
    yield process
    if process.cli is not None:
        process.cli.kill()


def replied(platform: ChatPlatform, place: str, count: int) -> list[str]:
    platform.wait_until(lambda: len(platform.replies(place)) >= count, WITHIN)
    return platform.replies(place)


def bodies_since(llm: FakeLLMServer, start: int) -> list[str]:
    return [request.raw_body.decode() for request in llm.raw_requests[start:]]


def test_a_dm_is_answered_once(platform: ChatPlatform, bot: BotProcess) -> None:
    bot.start()
    platform.dm("alice", "hello there")
    assert replied(platform, "dm:alice", 1) == ["Heard you."]
    platform.dm("alice", "and again")  # answered after the first: a repeat would be in between
    assert replied(platform, "dm:alice", 2) == ["Heard you.", "Heard you."]
    assert platform.replies("dm:bob") == [] and platform.replies("public") == []


def test_a_mention_is_answered_in_its_channel_and_other_messages_are_not(
    platform: ChatPlatform, bot: BotProcess, llm_server: FakeLLMServer
) -> None:
    bot.start()
    platform.say("public", "bob", "just chatting among ourselves")
    platform.mention("public", "alice", "hello bot")
    [answer] = replied(platform, "public", 1)
    assert "Heard you." in answer
    platform.say("public", "bob", "nobody asked the bot this")
    platform.mention("public", "alice", "one more")
    assert len(replied(platform, "public", 2)) == 2
    assert platform.replies("dm:alice") == platform.replies("dm:bob") == []
    # The model was asked about the two mentions only: the other lines were at most context.
    events = [body for body in bodies_since(llm_server, 0) if "nobody asked the bot this" in body]
    assert all("one more" in body for body in events)


def test_redeliveries_and_reconnects_are_answered_once(platform: ChatPlatform, bot: BotProcess) -> None:
    bot.start()
    sent = platform.dm("alice", "hello there")
    replied(platform, "dm:alice", 1)
    platform.redeliver(sent)
    connections = platform.connections()
    platform.reconnect()
    platform.wait_until(lambda: platform.connections() > connections, WITHIN)
    platform.redeliver(sent)  # through the new connection too
    platform.dm("alice", "after the reconnect")
    assert replied(platform, "dm:alice", 2) == ["Heard you.", "Heard you."]


def test_a_dm_fact_never_reaches_a_public_channels_request(
    platform: ChatPlatform, bot: BotProcess, llm_server: FakeLLMServer
) -> None:
    bot.start()
    platform.dm("alice", f"remember: my codeword is {CODEWORD}")
    replied(platform, "dm:alice", 1)
    asked = len(llm_server.raw_requests)
    platform.mention("public", "alice", "what is my codeword? search your memory")
    [answer] = replied(platform, "public", 1)
    public = bodies_since(llm_server, asked)
    assert len(public) >= 2  # the searches ran, and their results went back to the model
    assert not any(CODEWORD in body for body in public) and CODEWORD not in answer
    asked = len(llm_server.raw_requests)
    platform.dm("alice", "what is my codeword? search your memory")  # the same question in the DM finds it
    assert CODEWORD in replied(platform, "dm:alice", 2)[-1]
    assert any(CODEWORD in body for body in bodies_since(llm_server, asked))


def test_the_memory_command_answers_the_person_alone(platform: ChatPlatform, bot: BotProcess) -> None:
    bot.start()
    platform.dm("alice", f"remember: my codeword is {CODEWORD}")
    replied(platform, "dm:alice", 1)
    platform.command("alice", "memory")
    platform.wait_until(lambda: bool(platform.private_answers("alice")), WITHIN)
    [report] = platform.private_answers("alice")
    assert CODEWORD in report  # the DM's private block, shown to its owner
    assert platform.replies("dm:alice") == ["Noted."] and platform.replies("public") == []


def test_a_restart_keeps_memory(platform: ChatPlatform, bot: BotProcess) -> None:
    bot.start()
    platform.dm("alice", f"remember: my codeword is {CODEWORD}")
    replied(platform, "dm:alice", 1)
    assert bot.stop()[0] == 0
    bot.start()
    platform.dm("alice", "what is my codeword?")
    assert CODEWORD in replied(platform, "dm:alice", 2)[-1]


def test_the_token_is_never_logged(platform: ChatPlatform, bot: BotProcess) -> None:
    bot.start()  # at DEBUG: the client libraries' own debug lines included
    platform.dm("alice", "hello there")
    replied(platform, "dm:alice", 1)
    assert bot.stop()[0] == 0
    logs = bot.logs()
    assert "Heard you." in logs or "hello there" in logs or "connected" in logs  # the logs were read
    for secret in platform.secrets:
        assert secret not in logs


def test_the_platform_down_at_start_is_waited_for(platform: ChatPlatform, bot: BotProcess) -> None:
    platform.down()
    bot.start(wait_ready=False)
    bot.wait_for_line("retrying in")
    platform.up()
    bot.wait_for_line("check-ins: scheduler started")
    platform.dm("alice", "are you there?")
    assert replied(platform, "dm:alice", 1) == ["Heard you."]


def test_one_platform_down_at_start_does_not_hold_the_other(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.set_handler(story_model)
    with (
        contextlib.contextmanager(open_platform)("slack") as slack,
        contextlib.contextmanager(open_platform)("discord") as discord,
    ):
        discord.down()
        bot = BotProcess(slack, llm_server.base_url, tmp_path, extra=discord.env())
        try:
            bot.start(wait_ready=False)
            bot.wait_for_line("discord: cannot reach Discord")
            slack.dm("alice", "hello there")  # answered while Discord is still retrying
            assert replied(slack, "dm:alice", 1) == ["Heard you."]
            assert "check-ins: scheduler started" not in bot.stderr and discord.connections() == 0
            discord.up()
            bot.wait_for_line("check-ins: scheduler started")
            discord.dm("alice", "hello there")
            assert replied(discord, "dm:alice", 1) == ["Heard you."]
        finally:
            if bot.cli is not None:
                bot.cli.kill()


def test_sigterm_stops_promptly_while_the_embedding_model_loads(
    platform: ChatPlatform, bot: BotProcess, tmp_path: Path
) -> None:
    # A model whose files never finish reading (a FIFO nobody writes): its load lasts as
    # long as the process, like a slow first load of a real model on a busy machine.
    model = tmp_path / "model-that-never-loads"
    model.mkdir()
    for name in ("modules.json", "config_sentence_transformers.json", "config.json"):
        os.mkfifo(model / name)
    bot.extra = {"MEMGPT_WARM_UP": "1", "MEMGPT_EMBEDDING_MODEL": str(model)}
    bot.start()
    code, took = bot.stop(within=PROMPT_EXIT)
    assert code == 0, f"still running {took:.1f} s after SIGTERM:\n{bot.stderr}"


def test_shutdown_waits_for_the_event_in_flight(
    platform: ChatPlatform, bot: BotProcess, llm_server: FakeLLMServer
) -> None:
    asked, answer = threading.Event(), threading.Event()

    def slow_model(request: dict[str, Any]) -> Reply:
        asked.set()
        answer.wait(WITHIN)
        return story_model(request)

    llm_server.set_handler(slow_model)
    bot.start()
    platform.dm("alice", "hello there")
    assert asked.wait(WITHIN)
    assert bot.cli is not None
    cli = bot.cli
    cli.signal(signal.SIGTERM)  # SIGTERM while the model is thinking
    platform.wait_until(lambda: "stopping: waiting up to" in cli.stderr or cli.process.exitcode is not None, WITHIN)
    answer.set()
    assert cli.wait(WITHIN) == 0
    assert platform.replies("dm:alice") == ["Heard you."]  # answered before the process ended
    assert "could not mark event" not in bot.logs() and "is not open" not in bot.logs()
    llm_server.set_handler(story_model)
    bot.start()  # nothing was left unfinished: nothing is redone, nothing sent twice
    platform.dm("alice", "and again")
    assert replied(platform, "dm:alice", 2) == ["Heard you.", "Heard you."]
    assert "replayed" not in bot.stderr
