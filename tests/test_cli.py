"""The `memgpt-bot` command line, run as a real subprocess: real SQLite under a
temporary folder, real HTTP to the scripted local model server."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.terminal import TerminalChat
from bot.durable.lanes import Turn
from bot.events import Event, Reply, UserMessage
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call
from tests.forks import run_cli
from tests.helpers import free_port
from tests.recording_bot import RecordingBot
from tests.secrets_catalog import CLI_OPENAI_API_KEY

SECRET_KEY = CLI_OPENAI_API_KEY
TROUBLE = "I can't connect to my language model"


def base_env(llm_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMGPT_"))}
    env.update(
        OPENAI_BASE_URL=llm_url,
        OPENAI_API_KEY="test",
        MEMGPT_MODEL="test-model",
        MEMGPT_DATA_DIR=str(data_dir),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.update(extra)
    return env


def memgpt(
    *args: str, env: dict[str, str], cwd: Path, stdin: str | int | None = "", timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run `memgpt-bot ARGS` from a folder without a .env file: in a process forked
    from the tests' fork server (tests/forks.py), or, when standard input is a
    file descriptor (a terminal), as `python -m cli.main`."""
    if isinstance(stdin, str) or stdin is None:
        return run_cli(args, env=env, cwd=cwd, stdin=stdin, timeout=timeout)
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=stdin,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def failed(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a failed command."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("memgpt-bot: error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def send(text: str) -> Any:
    return reply_tool_calls(tool_call("send_message", {"message": text}))


# -- one chatted-with user shared by the read-only tests ------------------------
@dataclass
class Chatted:
    cwd: Path
    data_dir: Path
    env: dict[str, str]
    first: subprocess.CompletedProcess[str]
    second: subprocess.CompletedProcess[str]
    second_prompt: list[dict[str, Any]]


@pytest.fixture(scope="module")
def alice(llm_server_session: FakeLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chatted]:
    server = llm_server_session
    server.reset()
    cwd = tmp_path_factory.mktemp("alice")
    env = base_env(server.base_url, cwd / "data", OPENAI_API_KEY=SECRET_KEY)
    server.script(
        reply_tool_calls(
            tool_call(
                "core_memory_append",
                {
                    "name": "human",
                    "content": "Name: Alice. Has a cat called Miso.",
                    "request_heartbeat": True,
                },
            ),
        ),
        send("Nice to meet you, Alice!"),
        send("Miso sounds lovely."),
    )
    first = memgpt("chat", "--user", "alice", env=env, cwd=cwd, stdin="Hi, I'm Alice.\n\nMy cat is called Miso.\n")
    assert server.pending == 0
    server.script(send("Welcome back, Alice!"))
    second = memgpt("chat", "--user", "alice", env=env, cwd=cwd, stdin="Do you remember my cat?\n")
    prompt = server.requests[-1]["messages"]
    server.reset()
    yield Chatted(cwd, cwd / "data", env, first, second, prompt)


def test_chat_through_a_pipe_prints_only_replies_and_continues(alice: Chatted) -> None:
    assert ok(alice.first) == "Nice to meet you, Alice!\nMiso sounds lovely.\n"
    assert ok(alice.second) == "Welcome back, Alice!\n"
    # Run 2 continues the same relationship: the saved block and run 1's messages are in its prompt.
    assert "Has a cat called Miso." in alice.second_prompt[0]["content"]
    assert any("My cat is called Miso." in (m.get("content") or "") for m in alice.second_prompt[1:])
    log = (alice.data_dir / "memgpt-bot.log").read_text()
    assert "chat" in log and SECRET_KEY not in log


def test_memory_show_text_and_json(alice: Chatted) -> None:
    text = ok(memgpt("memory", "show", "--user", "alice", env=alice.env, cwd=alice.cwd))
    assert "terminal:alice" in text and "[human]" in text and "Has a cat called Miso." in text
    shown = json.loads(ok(memgpt("memory", "show", "--user", "alice", "--json", env=alice.env, cwd=alice.cwd)))
    assert shown["user"] == "terminal:alice"
    assert "Has a cat called Miso." in shown["working_context"]["human"]["value"]
    assert shown["working_context"]["persona"]["limit"] > 0
    counts = shown["counts"]
    # 3 user lines; 4 assistant steps (a block edit, 3 send_message), each with its tool result.
    assert counts["recall_messages"] == 11
    assert counts["queue_messages"] == 11 and counts["archival_passages"] == 0
    assert shown["summary"] == ""


def test_memory_search_recall_single_and_from_stdin(alice: Chatted) -> None:
    found = json.loads(
        ok(
            memgpt(
                "memory",
                "search",
                "--user",
                "alice",
                "--recall",
                "Miso",
                "--json",
                env=alice.env,
                cwd=alice.cwd,
            )
        )
    )
    assert found["store"] == "recall" and found["total"] >= 1
    assert any("My cat is called Miso." in (item["content"] or "") for item in found["results"])
    text = ok(memgpt("memory", "search", "--user", "alice", "--recall", "remember", env=alice.env, cwd=alice.cwd))
    assert "Do you remember my cat?" in text

    out = ok(
        memgpt(
            "memory",
            "search",
            "--user",
            "alice",
            "--recall",
            "-",
            "--limit",
            "2",
            env=alice.env,
            cwd=alice.cwd,
            stdin="remember cat\nunicorn spaceship\nAlice\n",
        )
    )
    answers = [json.loads(line) for line in out.splitlines()]
    assert [answer["query"] for answer in answers] == ["remember cat", "unicorn spaceship", "Alice"]
    assert any("Do you remember my cat?" in (item["content"] or "") for item in answers[0]["results"])
    # Ranked by meaning as the agent ranks, a query about nothing said still answers its nearest
    # messages, none of which holds its words.
    assert not [item for item in answers[1]["results"] if "unicorn" in (item["content"] or "")]
    assert 1 <= len(answers[2]["results"]) <= 2


def test_memory_export_holds_everything(alice: Chatted) -> None:
    data = json.loads(ok(memgpt("memory", "export", "--user", "alice", env=alice.env, cwd=alice.cwd)))
    assert data["user"] == "terminal:alice"
    contents = [message["content"] or "" for message in data["messages"]]
    assert any("Hi, I'm Alice." in content for content in contents)
    assert any("Do you remember my cat?" in content for content in contents)
    assert "Has a cat called Miso." in data["working_context"]["human"]["value"]


def test_forget_asks_at_a_terminal_and_yes_deletes_everything(alice: Chatted, tmp_path: Path) -> None:
    data_dir = tmp_path / "copy"
    shutil.copytree(alice.data_dir, data_dir)
    env = {**alice.env, "MEMGPT_DATA_DIR": str(data_dir)}
    if sys.platform != "win32":
        import pty

        controller, terminal = pty.openpty()
        try:
            os.write(controller, b"n\n")
            declined = memgpt("memory", "forget", "--user", "alice", env=env, cwd=tmp_path, stdin=terminal)
        finally:
            os.close(controller)
            os.close(terminal)
        assert declined.returncode != 0 and "Delete everything held on terminal:alice" in declined.stderr
        assert "Nothing deleted" in declined.stdout
        ok(memgpt("memory", "show", "--user", "alice", env=env, cwd=tmp_path))

    # Without a terminal, piped input is no answer, not even "y": nothing is deleted without --yes.
    for piped in ("no\n", "y\n"):
        refused = failed(memgpt("memory", "forget", "--user", "alice", env=env, cwd=tmp_path, stdin=piped))
        assert "without a terminal" in refused and "--yes" in refused
    assert "11 messages" in ok(memgpt("memory", "show", "--user", "alice", env=env, cwd=tmp_path))

    said = ok(memgpt("memory", "forget", "--user", "alice", "--yes", env=env, cwd=tmp_path))
    assert "terminal:alice" in said and "11 messages" in said
    error = failed(memgpt("memory", "show", "--user", "alice", env=env, cwd=tmp_path))
    assert "no memory held for user alice" in error
    failed(memgpt("memory", "export", "--user", "alice", env=env, cwd=tmp_path))


# -- import ----------------------------------------------------------------------
def test_import_then_recall_search_finds_it(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    history.write_text(
        "\n".join(
            json.dumps(line)
            for line in [
                {"role": "user", "content": "I adopted a parrot named Kiwi.", "timestamp": "2023-04-01T09:30:00"},
                {"role": "assistant", "content": "A parrot! Does Kiwi talk?", "timestamp": "2023-04-01T09:31:00Z"},
                {"role": "system", "content": "Conversation moved to DMs.", "timestamp": "2023-04-01T11:31:00+02:00"},
            ]
        )
        + "\n\n"
    )
    # --data-dir wins over MEMGPT_DATA_DIR, and no API key is needed for memory commands.
    env = base_env(llm_server.base_url, tmp_path / "elsewhere", OPENAI_API_KEY="")
    data = ["--data-dir", str(tmp_path / "data")]
    said = ok(memgpt(*data, "memory", "import", "--user", "alice", str(history), env=env, cwd=tmp_path))
    assert "Imported 3 messages" in said
    found = json.loads(
        ok(
            memgpt(
                "memory",
                "search",
                "--user",
                "alice",
                "--recall",
                "adopted parrot",
                "--json",
                *data,
                env=env,
                cwd=tmp_path,
            )
        )
    )
    assert found["total"] == 2  # both lines that mention a parrot
    first = found["results"][0]
    assert first["content"] == "I adopted a parrot named Kiwi." and first["role"] == "user"
    assert first["created_at"].startswith("2023-04-01T09:30:00") and first["created_at"].endswith("+00:00")
    assert (tmp_path / "data" / "memgpt-bot.log").exists() and not (tmp_path / "elsewhere").exists()
    # Again: everything is already held (same role, content and time), nothing is added twice.
    again = ok(memgpt(*data, "memory", "import", "--user", "alice", str(history), env=env, cwd=tmp_path))
    assert "Imported 0 messages" in again and "3 messages already held, skipped" in again
    assert llm_server.requests == []


def test_an_export_restores_into_an_empty_store_once(alice: Chatted, tmp_path: Path) -> None:
    exported = tmp_path / "alice.json"
    exported.write_text(ok(memgpt("memory", "export", "--user", "alice", env=alice.env, cwd=alice.cwd)))
    original = json.loads(exported.read_text())
    env = {**alice.env, "MEMGPT_DATA_DIR": str(tmp_path / "restored")}
    said = ok(memgpt("memory", "import", "--user", "alice", str(exported), env=env, cwd=tmp_path))
    assert f"Imported {len(original['messages'])} messages" in said and "Restored the working context" in said
    again = ok(memgpt("memory", "import", "--user", "alice", str(exported), env=env, cwd=tmp_path))
    assert "Imported 0 messages" in again
    restored = json.loads(ok(memgpt("memory", "export", "--user", "alice", env=env, cwd=tmp_path)))
    fields = ("role", "content", "tool_calls", "tool_call_id", "created_at")
    assert [[m[f] for f in fields] for m in restored["messages"]] == [
        [m[f] for f in fields] for m in original["messages"]
    ]
    assert restored["working_context"] == original["working_context"]
    assert [p["text"] for p in restored["passages"]] == [p["text"] for p in original["passages"]]


def test_import_with_a_bad_line_imports_nothing(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    history = tmp_path / "bad.jsonl"
    history.write_text(
        json.dumps({"role": "user", "content": "fine line", "timestamp": "2023-04-01T09:30:00"}) + "\n"
        '{"role": "user", "content": "broken", \n'
        + json.dumps({"role": "robot", "content": "bad role", "timestamp": "2023-04-01T09:30:00"})
        + "\n"
    )
    env = base_env(llm_server.base_url, tmp_path / "data")
    error = failed(memgpt("memory", "import", "--user", "alice", str(history), env=env, cwd=tmp_path))
    assert "line 2" in error and "nothing was imported" in error
    failed(memgpt("memory", "show", "--user", "alice", env=env, cwd=tmp_path))
    missing = failed(memgpt("memory", "import", "--user", "alice", str(tmp_path / "nope.jsonl"), env=env, cwd=tmp_path))
    assert "nope.jsonl" in missing


# -- failures ----------------------------------------------------------------------
def test_chat_without_api_key_is_one_clear_error(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    env = base_env(llm_server.base_url, tmp_path / "data", OPENAI_API_KEY="")
    result = memgpt("chat", "--user", "alice", env=env, cwd=tmp_path, stdin="hello\n")
    error = failed(result)
    assert "OPENAI_API_KEY" in error and "any value" in error
    assert result.stderr.strip() == error and result.stdout == ""
    assert llm_server.requests == []


def test_chat_with_the_llm_down_answers_the_trouble_and_keeps_the_line(tmp_path: Path) -> None:
    env = base_env(
        f"http://127.0.0.1:{free_port()}/v1",
        tmp_path / "data",
        MEMGPT_LLM_MAX_RETRIES="0",
        MEMGPT_LLM_TIMEOUT="2",
    )
    result = memgpt("chat", "--user", "alice", env=env, cwd=tmp_path, stdin="Remember the zebra crossing.\n")
    out = ok(result)
    assert out.count("\n") == 1 and TROUBLE in out
    found = json.loads(
        ok(
            memgpt(
                "memory",
                "search",
                "--user",
                "alice",
                "--recall",
                "zebra",
                "--json",
                env=env,
                cwd=tmp_path,
            )
        )
    )
    assert any("Remember the zebra crossing." in (item["content"] or "") for item in found["results"])


def test_version_and_usage_errors(tmp_path: Path) -> None:
    env = base_env("http://127.0.0.1:9/v1", tmp_path / "data")
    assert ok(memgpt("--version", env=env, cwd=tmp_path)).startswith("memgpt-bot ")
    bad = memgpt("memory", "show", "--user", "discord:", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "PLATFORM:ID" in bad.stderr


# -- platform users ---------------------------------------------------------------
def test_platform_users_keep_separate_memories(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    env = base_env(llm_server.base_url, tmp_path / "data")
    said = {
        "discord:1234": "I love kayaking on weekends.",
        "slack:T1:U2": "I love chess openings.",
        "alice": "I love gardening tomatoes.",
    }
    for user, line in said.items():
        llm_server.script(send(f"Got it, {user}."))
        assert ok(memgpt("chat", "--user", user, env=env, cwd=tmp_path, stdin=line + "\n")) == f"Got it, {user}.\n"
    platforms = [request["messages"][-1]["content"] for request in llm_server.requests]
    assert "1234 in terminal: I love kayaking" in platforms[0]

    queries = "kayaking\nchess\ngardening\n"
    for user, line in said.items():
        out = ok(memgpt("memory", "search", "--user", user, "--recall", "-", env=env, cwd=tmp_path, stdin=queries))
        hits = {
            answer["query"]: [item["content"] for item in answer["results"]]
            for answer in map(json.loads, out.splitlines())
        }
        own = next(word for word in hits if word in line)
        assert line in hits[own][0]  # ranked as the agent ranks: the own line first
        # Ranked by meaning too, every query answers with something: never another user's words.
        others = [text for user_, text in said.items() if user_ != user]
        assert not [item for items in hits.values() for item in items if any(o in (item or "") for o in others)]
    exported = json.loads(ok(memgpt("memory", "export", "--user", "slack:T1:U2", env=env, cwd=tmp_path)))
    assert exported["user"] == "slack:T1:U2"


# -- archival search (the one test that loads the embedding model) ------------------
def test_archival_search_finds_a_passage_the_model_saved(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    env = base_env(llm_server.base_url, tmp_path / "data")
    llm_server.script(
        reply_tool_calls(
            tool_call(
                "archival_memory_insert",
                {
                    "content": "Alice climbed Mont Blanc in 2019; it is her favourite mountain.",
                    "request_heartbeat": False,
                },
            ),
            tool_call(
                "archival_memory_insert",
                {
                    "content": "Alice's go-to recipe is a lemon risotto with parmesan.",
                    "request_heartbeat": False,
                },
            ),
            tool_call("send_message", {"message": "I'll remember both."}),
        )
    )
    ok(memgpt("chat", "--user", "alice", env=env, cwd=tmp_path, stdin="Two facts about me: mountains and risotto.\n"))
    found = json.loads(
        ok(
            memgpt(
                "memory",
                "search",
                "--user",
                "alice",
                "--archival",
                "which peak did she hike?",
                "--limit",
                "1",
                "--json",
                env=env,
                cwd=tmp_path,
            )
        )
    )
    assert found["store"] == "archival" and found["total"] == 2
    assert len(found["results"]) == 1 and "Mont Blanc" in found["results"][0]["text"]


# -- the terminal adapter at a (pretend) terminal ------------------------------------
async def test_terminal_adapter_interactive_keeps_prompts_off_stdout() -> None:
    class EchoBot(RecordingBot):
        async def handle(self, event: Event, turn: Turn | None = None) -> list[Reply]:
            assert isinstance(event, UserMessage)
            self.events.append(event)
            return [event.reply(f"echo: {event.text}")]

    bot = EchoBot()
    stdout, stderr = io.StringIO(), io.StringIO()
    chat = TerminalChat(
        bot,
        "bob",
        stdin=io.StringIO("hello\n   \nsecond line\n"),
        stdout=stdout,
        stderr=stderr,
        interactive=True,
    )
    assert await asyncio.wait_for(chat.run(), 5) == 2
    assert stdout.getvalue() == "echo: hello\necho: second line\n"
    assert "you> " in stderr.getvalue() and "Chatting as bob" in stderr.getvalue()
    expected = [("terminal", "bob", "terminal", "bob")] * 2
    assert [(e.platform, e.user_id, e.channel, e.display_name) for e in bot.messages()] == expected


def test_limits_show_reports_usage_with_the_budget_off(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    # 25 answered calls with MEMGPT_DAILY_TOKEN_BUDGET=0 showed 0 tokens: nothing was counted.
    env = base_env(llm_server.base_url, tmp_path / "data", MEMGPT_DAILY_TOKEN_BUDGET="0")
    llm_server.script(send("one"), send("two"))
    ok(memgpt("chat", "--user", "bob", env=env, cwd=tmp_path, stdin="hello\n\nagain\n"))
    shown = json.loads(ok(memgpt("limits", "show", "bob", "--json", env=env, cwd=tmp_path)))
    assert shown["daily_token_budget"] == 0 and shown["tokens_today"] > 2_000


async def test_a_command_s_runtime_freezes_the_start_up_heap_out_of_full_collections(tmp_path: Path) -> None:
    # The modules, types and tokenizer a bot process holds for its life: a full
    # collection that walks them on every pass costs each event CPU
    # (bench/throughput_processes.py).
    import gc

    from bot.config import Settings
    from cli.common import open_runtime

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    async with open_runtime(Settings(openai_api_key="test", data_dir=tmp_path)):
        try:
            assert gc.get_freeze_count() > 10_000
        finally:
            gc.unfreeze()
