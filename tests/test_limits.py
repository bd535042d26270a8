"""Abuse and cost control (bot/limits.py): the per-user message rate and daily
token budget, through the real runtime, SQLite store and local LLM server.
Time moves by an injected clock, never by sleeping."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.config import Settings
from bot.errors import ConfigError
from bot.events import FileUploaded, ScheduledTick, UserMessage
from bot.limits import MESSAGE, TOKENS
from bot.runtime import Runtime
from bot.settings import LeaseSettings
from memory.types import Message
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, Reply, reply_text, reply_tool_calls, tool_call
from tests.forks import run_cli

KEY = "discord:42"
START = datetime(2031, 3, 14, 9, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def answer(request: dict[str, Any]) -> Reply:
    return reply_tool_calls(tool_call("send_message", {"message": "answered"}))


def message(text: str, user_id: str = "42") -> UserMessage:
    return UserMessage(platform="discord", user_id=user_id, text=text, display_name="Sam")


async def limited(make_runtime: RuntimeFactory, clock: Clock, data_dir: Path | None = None, **limits: Any) -> Runtime:
    settings = {"rate_limit_per_minute": 0, "daily_token_budget": 0, **limits}
    runtime = await make_runtime(data_dir, **settings)
    runtime.limits.clock = clock
    return runtime


async def recall_texts(runtime: Runtime, key: str = KEY) -> list[str]:
    agent = await runtime.agent(key)
    return [m.content or "" for m in await runtime.store.messages_since(agent.id, 0) if m.role == "user"]


async def test_rate_limit_holds_messages_over_n_a_minute_keeps_them_and_tells_once(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(answer)
    clock = Clock()
    runtime = await limited(make_runtime, clock, rate_limit_per_minute=3)
    for n in range(3):
        assert [r.text for r in await runtime.handle(message(f"message {n}"))] == ["answered"]
        clock.advance(seconds=5)
    calls = len(llm_server.raw_requests)

    over = await runtime.handle_with_details(message("message 3, too fast"))
    assert over.held == "rate" and over.steps == 0 and over.tokens_used == 0
    [notice] = over.replies
    assert "3 messages a minute" in notice.text and "09:01:00 UTC" in notice.text and "45 seconds" in notice.text
    assert notice.event_id and notice.platform == "discord" and notice.user_id == "42"
    # Spam after the notice: kept, not answered, not told again.
    for n in range(4, 8):
        clock.advance(seconds=1)
        assert await runtime.handle(message(f"message {n}, too fast")) == []
    assert len(llm_server.raw_requests) == calls  # no LLM call for any of them
    kept = await recall_texts(runtime)
    assert sum("too fast" in text for text in kept) == 5
    assert all("[held: sent over the message rate limit" in text for text in kept if "too fast" in text)
    found = await runtime.recall.search((await runtime.agent(KEY)).id, "message 6", 10)
    assert any("message 6, too fast" in (m.content or "") for m in found.items)

    # A minute after the first message the window has room again, and the
    # model sees what was held meanwhile.
    clock.now = START + timedelta(seconds=60)
    assert [r.text for r in await runtime.handle(message("message 8, after the pause"))] == ["answered"]
    prompt = " ".join(str(m.get("content")) for m in llm_server.requests[-1]["messages"])
    assert "message 7, too fast" in prompt and "message 8, after the pause" in prompt
    # Over again (messages at 0:05, 0:10 and 1:00 fill the window): a new
    # episode, so told again, once.
    clock.advance(seconds=1)
    replies = await runtime.handle(message("message 9"))
    assert len(replies) == 1 and "until 09:01:05 UTC" in replies[0].text
    assert await runtime.handle(message("message 10")) == []


async def test_only_what_a_person_sends_counts_toward_the_rate(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    llm_server.set_handler(answer)
    clock = Clock()
    runtime = await limited(make_runtime, clock, rate_limit_per_minute=1)
    tick = ScheduledTick(platform="discord", user_id="42", reason="Daily check-in")
    assert (await runtime.handle_with_details(tick)).held == ""
    assert (await runtime.handle_with_details(message("hello"))).held == ""
    assert (await runtime.handle_with_details(ScheduledTick(platform="discord", user_id="42", reason="x"))).held == ""
    # An upload over the rate is not read, and says so in recall storage.
    upload = FileUploaded(platform="discord", user_id="42", filename="notes.md", data=b"# Notes\n\nPlant beans.")
    result = await runtime.handle_with_details(upload)
    assert result.held == "rate" and "messages a minute" in result.replies[0].text
    agent = await runtime.agent(KEY)
    assert await runtime.store.count_passages(agent.id) == 0
    assert any("notes.md" in text and "not read" in text for text in await recall_texts(runtime))
    assert (await runtime.store.usage_since(KEY, MESSAGE, START)).count == 1


async def test_an_admitted_event_reads_its_counters_in_one_call_and_writes_them_in_one(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each store call is a round trip (a thread hop on SQLite, the network on
    # MongoDB) between two LLM calls: the checks read together, and the
    # message's hit goes out with the event's tokens.
    llm_server.set_handler(answer)
    clock = Clock()
    runtime = await limited(make_runtime, clock, rate_limit_per_minute=5, daily_token_budget=10**6)
    await runtime.handle(message("first"))
    store, calls = runtime.store, []

    def spy(name: str) -> Any:
        original = getattr(store, name)

        def counted(*args: Any) -> Any:
            calls.append(name)
            return original(*args)

        return counted

    for name in ("usage_windows", "usage_since", "usage_exempt", "record_usage"):
        monkeypatch.setattr(store, name, spy(name))
    clock.advance(seconds=2)
    admitted_at = clock.now
    result = await runtime.handle_with_details(message("second"))
    assert [r.text for r in result.replies] == ["answered"]
    assert calls == ["usage_windows", "record_usage"]
    messages = await store.usage_since(KEY, MESSAGE, START)
    assert (messages.count, messages.newest) == (2, admitted_at)
    assert (await store.usage_since(KEY, TOKENS, admitted_at)).amount == result.tokens_used


async def test_token_budget_is_counted_locally_then_holds_until_midnight_utc(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(answer)
    clock = Clock(START.replace(hour=21, minute=30))
    runtime = await limited(make_runtime, clock, daily_token_budget=500)
    first = await runtime.handle_with_details(message("hello"))
    assert [r.text for r in first.replies] == ["answered"]
    # Counted here with the tokenizer: the prompt as sent (tools included) and
    # the answer; the fake server's own `usage` numbers are never read.
    counter = runtime.services.counter
    request = llm_server.requests[-1]
    exact = counter.count_request(request["messages"], request["tools"])
    assert exact < first.tokens_used < exact + 80
    spent = await runtime.store.usage_since(KEY, TOKENS, START)
    assert spent.amount == first.tokens_used > 500
    calls = len(llm_server.raw_requests)

    over = await runtime.handle_with_details(message("are you there?"))
    assert over.held == "budget"
    [notice] = over.replies
    assert "midnight UTC" in notice.text and "2 h 30 min" in notice.text and "500" in notice.text
    assert await runtime.handle(message("hello??")) == []  # told once a day
    tick = await runtime.handle_with_details(ScheduledTick(platform="discord", user_id="42", reason="Check-in"))
    assert tick.held == "budget" and tick.replies == []  # skipped, nothing recorded
    assert len(llm_server.raw_requests) == calls
    kept = await recall_texts(runtime)
    assert any("are you there?" in text and "token budget" in text for text in kept)
    assert not any("[scheduled tick]" in text for text in kept)

    clock.now = START.replace(hour=23, minute=59, second=59)
    assert await runtime.handle(message("still there?")) == []
    clock.now = START.replace(hour=0) + timedelta(days=1)  # a new UTC day
    assert [r.text for r in await runtime.handle(message("good morning"))] == ["answered"]
    assert len(llm_server.raw_requests) == calls + 1


async def test_the_summarizer_call_is_counted_too(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.script(reply_text("They said hello."))
    runtime = await make_runtime()
    agent = await runtime.agent(KEY)
    before = agent.tokens_used
    summary = await agent.calls.summarize("", [Message(role="user", content="hello there")], 100)
    counter = runtime.services.counter
    request = llm_server.requests[-1]
    assert "tools" not in request
    assert agent.tokens_used - before == counter.count_request(request["messages"]) + counter.count(summary)


async def test_exempt_users_by_setting_are_never_held(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(answer)
    clock = Clock()
    runtime = await limited(make_runtime, clock, rate_limit_per_minute=1, daily_token_budget=10, unlimited_users=(KEY,))
    for n in range(3):
        assert [r.text for r in await runtime.handle(message(f"message {n}"))] == ["answered"]
    # Still counted, for `limits show`.
    assert (await runtime.limits.usage(KEY)).messages_last_minute == 3
    # Somebody else is held.
    await runtime.handle(message("one", user_id="7"))
    assert (await runtime.handle_with_details(message("two", user_id="7"))).held == "budget"


async def test_exempt_users_by_admin_are_let_through_and_the_exemption_is_read_only_over_a_limit(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm_server.set_handler(answer)
    clock = Clock()
    runtime = await limited(make_runtime, clock, rate_limit_per_minute=1, daily_token_budget=10**6)
    assert await runtime.limits.set_exempt(KEY, True)
    store, reads = runtime.store, []
    read_exemption = store.usage_exempt

    async def usage_exempt(key: str) -> bool:
        reads.append(key)
        return await read_exemption(key)

    monkeypatch.setattr(store, "usage_exempt", usage_exempt)
    assert (await runtime.handle_with_details(message("one"))).held == ""
    assert reads == []  # under every limit: not read
    assert (await runtime.handle_with_details(message("two"))).held == ""  # over the rate, but exempt
    assert reads == [KEY]
    assert (await runtime.limits.usage(KEY)).messages_last_minute == 2


async def test_two_runtimes_on_one_file_share_the_counters(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    llm_server.set_handler(answer)
    clock = Clock()
    limits = {"rate_limit_per_minute": 2, "daily_token_budget": 10**9}
    first = await limited(make_runtime, clock, tmp_path / "shared", **limits)
    second = await limited(make_runtime, clock, tmp_path / "shared", **limits)
    assert (await first.handle_with_details(message("one"))).held == ""
    assert (await second.handle_with_details(message("two"))).held == ""
    assert (await first.handle_with_details(message("three"))).held == "rate"
    assert (await second.handle_with_details(message("four"))).held == "rate"
    # The budget too: what one spent, the other sees.
    for runtime in (first, second):
        runtime.limits.daily_budget = (await first.limits.usage(KEY)).tokens_today
        runtime.limits.rate_limit = 0
    assert (await second.limits.usage(KEY)).tokens_today > 0
    assert (await second.handle_with_details(message("five"))).held == "budget"


async def test_with_leases_one_read_serves_the_next_admissions_until_another_process_served_the_person(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm_server.set_handler(answer)
    clock = Clock()
    limits = {"rate_limit_per_minute": 3, "daily_token_budget": 10**9, "leases": LeaseSettings(mode="on")}
    first = await limited(make_runtime, clock, tmp_path / "shared", **limits)
    second = await limited(make_runtime, clock, tmp_path / "shared", **limits)
    reads: list[str] = []
    original = first.store.usage_windows

    async def usage_windows(key: str, windows: Any) -> Any:
        if TOKENS in dict(windows):  # admission's read (usage_since reads through here too)
            reads.append(key)
        return await original(key, windows)

    monkeypatch.setattr(first.store, "usage_windows", usage_windows)
    assert (await first.handle_with_details(message("one"))).held == ""
    assert (await first.handle_with_details(message("two"))).held == ""
    assert len(reads) == 1  # its own turns in a row: what it counted is all there is
    assert (await second.handle_with_details(message("three"))).held == ""
    # Another process served the person in between: read again, and the third message counts.
    assert (await first.handle_with_details(message("four"))).held == "rate"
    assert len(reads) == 2
    # Counters reset elsewhere (`limits reset`): what this process remembers is over, so it reads.
    await second.limits.reset(KEY)
    assert (await first.handle_with_details(message("five"))).held == ""
    assert len(reads) == 3
    clock.advance(days=1)  # a new day's budget is read, not carried over
    assert (await first.handle_with_details(message("six"))).held == ""
    assert len(reads) == 4


async def test_forget_deletes_the_counters(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(answer)
    clock = Clock()
    runtime = await limited(make_runtime, clock, rate_limit_per_minute=1, daily_token_budget=100_000)
    await runtime.handle(message("one"))
    assert (await runtime.handle_with_details(message("two"))).held == "rate"
    assert await runtime.forget(KEY)
    for kind in (MESSAGE, TOKENS, "notice:rate"):
        assert (await runtime.store.usage_since(KEY, kind, START - timedelta(days=1))).count == 0
    assert (await runtime.handle_with_details(message("hello again"))).held == ""


def limits_cli(*args: str, data_dir: Path, **env: str) -> str:
    environment = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(data_dir.parent),
        "MEMGPT_DATA_DIR": str(data_dir),
        "MEMGPT_MODEL": "test-model",
        "HF_HUB_OFFLINE": "1",
        **env,
    }
    # A process forked from the tests' fork server: `python -m cli.main` without the imports.
    done = run_cli(["limits", *args], env=environment, cwd=data_dir.parent, stdin=None, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


async def test_admin_exempts_shows_and_resets_from_the_command_line(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    llm_server.set_handler(answer)
    clock = Clock(datetime.now(UTC))  # the CLI's `show` reads the real clock
    data_dir = tmp_path / "data"
    runtime = await limited(make_runtime, clock, data_dir, rate_limit_per_minute=1)
    await runtime.handle(message("one"))
    assert (await runtime.handle_with_details(message("two"))).held == "rate"

    shown = json.loads(limits_cli("show", KEY, "--json", data_dir=data_dir, MEMGPT_RATE_LIMIT_PER_MINUTE="1"))
    assert shown["messages_last_minute"] == 1 and shown["rate_limit_per_minute"] == 1 and not shown["exempt"]

    # Exempted while the bot runs: its next message goes through at once.
    assert "now exempt" in limits_cli("exempt", KEY, data_dir=data_dir)
    assert (await runtime.handle_with_details(message("three"))).held == ""
    assert KEY in limits_cli("show", data_dir=data_dir)
    assert "exempt: yes (by limits exempt)" in limits_cli("show", KEY, data_dir=data_dir)
    assert "no longer exempt" in limits_cli("unexempt", KEY, data_dir=data_dir)
    assert (await runtime.handle_with_details(message("four"))).held == "rate"

    # Reset: the counters start from zero.
    assert "Reset the counters of discord:42" in limits_cli("reset", "discord:42", data_dir=data_dir)
    assert (await runtime.handle_with_details(message("five"))).held == ""
    by_env = limits_cli("show", "alice", data_dir=data_dir, MEMGPT_UNLIMITED_USERS="alice, slack:T1:U2")
    assert "terminal:alice" in by_env and "exempt: yes (by MEMGPT_UNLIMITED_USERS)" in by_env


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MEMGPT_RATE_LIMIT_PER_MINUTE", "MEMGPT_DAILY_TOKEN_BUDGET", "MEMGPT_MAX_MESSAGE_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MEMGPT_CONTEXT_WINDOW", "16000")
    monkeypatch.setenv("MEMGPT_UNLIMITED_USERS", " alice, discord:1,,slack:T1:U2, discord:1")
    settings = Settings.from_env(env_file=None)
    assert settings.unlimited_users == ("terminal:alice", "discord:1", "slack:T1:U2")
    assert settings.rate_limit_per_minute == 20 and settings.daily_token_budget == 50 * 16000
    assert settings.max_message_tokens == 0
    monkeypatch.setenv("MEMGPT_DAILY_TOKEN_BUDGET", "0")  # off
    assert Settings.from_env(env_file=None).daily_token_budget == 0
    monkeypatch.setenv("MEMGPT_UNLIMITED_USERS", "source:docs")
    with pytest.raises(ConfigError, match="MEMGPT_UNLIMITED_USERS"):
        Settings.from_env(env_file=None)
    monkeypatch.setenv("MEMGPT_UNLIMITED_USERS", "")
    monkeypatch.setenv("MEMGPT_RATE_LIMIT_PER_MINUTE", "-1")
    with pytest.raises(ConfigError, match="MEMGPT_RATE_LIMIT_PER_MINUTE"):
        Settings.from_env(env_file=None)
