"""No secret setting ever reaches a log line, an error message or the CLI's output.

Every secret the bot has (OPENAI_API_KEY, DISCORD_TOKEN, SLACK_BOT_TOKEN,
SLACK_APP_TOKEN, SLACK_SIGNING_SECRET, the MongoDB password in MONGODB_URI)
is set to a distinctive value from tests/secrets_catalog.py, and the paths
that log or raise are driven with logging at DEBUG (third-party debug output
is where request headers would show): settings, LLM errors (servers that
echo the key they refused), Slack and Discord credential failures, MongoDB
connection and configuration errors, and the `memgpt-bot` command line as a
subprocess (standard error, standard output and its log file).

The same values are what scripts/scan_logs_for_secrets.py looks for in a
whole test session's logs (tests/log_capture.py); the last tests here prove
that capture and that scanner can fail.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bot.config import Settings
from bot.errors import ConfigError
from bot.events import UserMessage
from bot.llm import LLMClient, LLMUnavailableError, Request
from memory.mongo.store import MongoStore
from memory.store import StoreError
from tests import secrets_catalog as catalog
from tests.conftest import RuntimeFactory
from tests.fake_llm import RETRY_NOW, FakeLLMServer, Reply, fault_disconnect, fault_status, reply_tool_calls, tool_call
from tests.fake_slack import FakeSlack, signature_headers
from tests.log_capture import ENV as LOG_SCAN_ENV
from tests.log_capture import capture_file, session_log_capture
from tests.test_cli import base_env, memgpt

ROOT = Path(__file__).resolve().parents[1]
SCANNER = ROOT / "scripts" / "scan_logs_for_secrets.py"

# What a deployment sets, all at once.
SECRET_ENV = {
    "OPENAI_API_KEY": catalog.OPENAI_API_KEY,
    "DISCORD_TOKEN": catalog.DISCORD_TOKEN,
    "SLACK_BOT_TOKEN": catalog.SLACK_BOT_TOKEN,
    "SLACK_APP_TOKEN": catalog.SLACK_APP_TOKEN,
    "SLACK_SIGNING_SECRET": catalog.SLACK_SIGNING_SECRET,
    "MONGODB_URI": catalog.MONGODB_URI,
}


def leaked(*texts: object) -> list[str]:
    """The catalog's labels whose value is in any of `texts`."""
    joined = "\n".join(str(text) for text in texts)
    return sorted(label for label, value in catalog.SECRETS.items() if value in joined)


def error_texts(error: BaseException) -> str:
    """Everything an error can put in a log: its message and its whole
    traceback, chained causes included (what `log.exception` writes)."""
    return "".join(traceback.format_exception(error))


def test_the_catalog_is_scannable() -> None:
    values = list(catalog.SECRETS.values())
    assert len(set(values)) == len(values)
    # Long enough that a hit in a log is never a coincidence.
    assert all(len(value) >= 10 for value in values)
    assert set(SECRET_ENV.values()) - {catalog.MONGODB_URI} <= set(values)
    assert catalog.MONGODB_PASSWORD in catalog.MONGODB_URI


# -- settings -------------------------------------------------------------------
def test_settings_show_no_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in SECRET_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MEMGPT_DATA_DIR", str(tmp_path))
    settings = Settings.from_env(env_file=None)
    assert settings.openai_api_key == catalog.OPENAI_API_KEY and settings.mongodb_uri == catalog.MONGODB_URI
    # What the CLI logs at start, and what a debugger, a failed assertion or
    # an f-string would show.
    assert leaked(settings.redacted(), repr(settings), str(settings)) == []
    monkeypatch.setenv("MEMGPT_CONTEXT_WINDOW", "lots")
    with pytest.raises(ConfigError) as bad:
        Settings.from_env(env_file=None)
    assert leaked(error_texts(bad.value)) == []


def test_platform_configs_show_no_secret() -> None:
    from adapters.discord import DiscordConfig
    from adapters.slack import SlackConfig
    from cli.app import plan_adapters

    discord_config = DiscordConfig.from_env(SECRET_ENV)
    slack_config = SlackConfig.from_env(SECRET_ENV)
    assert discord_config is not None and slack_config is not None
    assert leaked(repr(discord_config), repr(slack_config)) == []
    # A token pasted into the wrong variable is named by variable, never shown.
    wrong = {**SECRET_ENV, "SLACK_BOT_TOKEN": catalog.SLACK_APP_TOKEN, "SLACK_APP_TOKEN": catalog.SLACK_BOT_TOKEN}
    with pytest.raises(ValueError) as bad:
        SlackConfig.from_env(wrong)
    assert leaked(error_texts(bad.value)) == []
    reasons = [plan.reason for plan in plan_adapters(object(), wrong)]  # type: ignore[arg-type]
    assert leaked(reasons) == [] and any("SLACK_BOT_TOKEN" in reason for reason in reasons)


# -- the LLM --------------------------------------------------------------------
def echoing(status: int) -> Reply:
    """An error that quotes the key back, as some OpenAI-compatible servers and
    proxies do (OpenAI itself shows all but the last four characters)."""
    body = {
        "error": {
            "message": f"Incorrect API key provided: {catalog.OPENAI_API_KEY}. "
            f"Header was 'Authorization: Bearer {catalog.OPENAI_API_KEY}'.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    return fault_status(status, body=body, headers={**RETRY_NOW, "x-should-retry": "false"})


@pytest.mark.parametrize("fault", [401, 400, 403, 404, 429, 500, "disconnect"])
async def test_llm_errors_never_show_the_api_key(
    fault: int | str, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.script(fault_disconnect() if fault == "disconnect" else echoing(int(fault)))
    client = LLMClient(
        "test-model", api_key=catalog.OPENAI_API_KEY, base_url=llm_server.base_url, timeout=5.0, max_retries=0
    )
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(LLMUnavailableError) as failed:
            await client.complete(Request([{"role": "user", "content": "hi"}]))
    finally:
        await client.close()
    # The key was really sent (so the test is about this key)...
    assert llm_server.raw_requests[-1].headers["authorization"] == f"Bearer {catalog.OPENAI_API_KEY}"
    # ...and is in no log record, no message, no traceback.
    assert caplog.records
    assert leaked(caplog.text, error_texts(failed.value), failed.value.user_message) == []


async def test_an_agent_whose_key_is_refused_logs_no_key(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.set_handler(lambda request: echoing(401))
    runtime = await make_runtime()  # configured with catalog.OPENAI_API_KEY (tests/conftest.py)
    with caplog.at_level(logging.DEBUG):
        replies = await runtime.handle(UserMessage(platform="slack", user_id="T1:U1", text="hello"))
    assert replies and "API key" in replies[0].text
    assert any("authentication failed" in record.getMessage() for record in caplog.records)
    assert leaked(caplog.text, [reply.text for reply in replies]) == []


# -- Slack ------------------------------------------------------------------------
def slack_event(text: str, **extra: Any) -> dict[str, Any]:
    event = {
        "type": "message",
        "channel_type": "im",
        "channel": "DU1",
        "user": "U1",
        "team": "T1",
        "text": text,
        "ts": f"{time.time():.6f}",
        **extra,
    }
    return {
        "token": "legacy",
        "team_id": "T1",
        "api_app_id": "A1",
        "event": event,
        "type": "event_callback",
        "event_id": f"Ev{uuid.uuid4().hex[:12].upper()}",
        "event_time": int(time.time()),
        "authorizations": [{"team_id": "T1", "user_id": "UBOT", "is_bot": True}],
    }


async def test_slack_credential_failures_and_traffic_log_no_secret(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    from adapters.slack import SlackAdapter, SlackConfig

    llm_server.set_handler(lambda request: reply_tool_calls(tool_call("send_message", {"message": "ok"})))
    runtime = await make_runtime()
    adapters: list[SlackAdapter] = []
    errors: list[BaseException] = []
    with (
        FakeSlack(bot_token=catalog.SLACK_BOT_TOKEN, app_token=catalog.SLACK_APP_TOKEN) as slack,
        caplog.at_level(logging.DEBUG),
    ):
        slack.add_user("U1", "Alice")

        async def start(**settings: Any) -> SlackAdapter:
            config = {
                "bot_token": catalog.SLACK_BOT_TOKEN,
                "signing_secret": catalog.SLACK_SIGNING_SECRET,
                "api_url": slack.api_url,
                "http_host": "127.0.0.1",
                "http_port": 0,
                **settings,
            }
            adapter = SlackAdapter(runtime, SlackConfig(**config))
            adapters.append(adapter)
            await adapter.connect()
            return adapter

        try:
            # Refused credentials, both kinds.
            for wrong in (
                {"bot_token": catalog.WRONG_SLACK_BOT_TOKEN},
                {"app_token": catalog.WRONG_SLACK_APP_TOKEN, "signing_secret": None},
            ):
                with pytest.raises(RuntimeError) as refused:
                    await start(**wrong)
                errors.append(refused.value)
            # Socket Mode with the right app token: the WebSocket URL is fetched with it.
            await start(app_token=catalog.SLACK_APP_TOKEN, signing_secret=None)
            await slack.wait_for("socket_mode.connect")
            # HTTP mode: a forged request, a message, a shared file (downloaded with the
            # bot token), and a reply Slack refuses.
            adapter = await start()
            url = f"http://127.0.0.1:{adapter.port}/slack/events"
            shared = slack.add_file("notes.md", "# Notes\n\nalpha")
            async with aiohttp.ClientSession() as session:
                for body, secret in (
                    (json.dumps(slack_event("forged")), catalog.WRONG_SLACK_BOT_TOKEN),
                    (json.dumps(slack_event("hello")), catalog.SLACK_SIGNING_SECRET),
                    (json.dumps(slack_event("", subtype="file_share", files=[shared])), catalog.SLACK_SIGNING_SECRET),
                ):
                    headers = {"Content-Type": "application/json", **signature_headers(body, secret)}
                    async with session.post(url, data=body.encode(), headers=headers) as response:
                        await response.read()
            await slack.wait_for("chat.postMessage", 2, within=60)
            slack.fail("chat.postMessage", "channel_not_found")
            async with aiohttp.ClientSession() as session:
                body = json.dumps(slack_event("once more"))
                headers = {"Content-Type": "application/json", **signature_headers(body, catalog.SLACK_SIGNING_SECRET)}
                async with session.post(url, data=body.encode(), headers=headers) as response:
                    await response.read()
            await slack.wait_for("chat.postMessage", 3, within=60)
            await adapter.drain()
        finally:
            for adapter in adapters:
                await adapter.close(grace=5)
    # The tokens were really used...
    assert slack.calls_to("file_download") and slack.calls_to("apps.connections.open")
    assert any(call.headers.get("Authorization") == f"Bearer {catalog.SLACK_BOT_TOKEN}" for call in slack.calls)
    # ...and shown nowhere.
    assert leaked(caplog.text, *(error_texts(error) for error in errors)) == []


# -- Discord ------------------------------------------------------------------------
@pytest.fixture
async def fake_discord_api(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[str]]:
    """discord.py's REST calls go to a local server that refuses every token
    (and records the Authorization headers it got)."""
    import discord.http

    seen: list[str] = []

    async def refuse(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"message": "401: Unauthorized", "code": 0}, status=401)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    monkeypatch.setattr(discord.http.Route, "BASE", f"http://127.0.0.1:{port}/api/v10")
    try:
        yield seen
    finally:
        await runner.cleanup()


async def test_a_refused_discord_token_is_not_shown(
    make_runtime: RuntimeFactory, fake_discord_api: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    from adapters.discord import DiscordAdapter, DiscordConfig
    from cli.app import AdapterPlan, NoAdapterError, run_adapters

    config = DiscordConfig.from_env({"DISCORD_TOKEN": catalog.WRONG_DISCORD_TOKEN})
    assert config is not None
    adapter = DiscordAdapter(await make_runtime(), config)
    said: list[str] = []
    with caplog.at_level(logging.DEBUG), pytest.raises(NoAdapterError) as stopped:
        # The path of `memgpt-bot run`: the adapter stops, the error is logged and announced.
        await run_adapters([AdapterPlan("discord", adapter, "gateway connection")], said.append)
    said.append(str(stopped.value))  # what `run` prints last, as its error
    assert fake_discord_api == [f"Bot {catalog.WRONG_DISCORD_TOKEN}"]
    assert any("discord: stopped" in line for line in said)
    assert leaked(caplog.text, said) == []


# -- MongoDB ------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::UserWarning")  # pymongo warns about the bad options it is given
@pytest.mark.parametrize(
    "uri",
    [
        catalog.MONGODB_URI,  # nothing listens on port 1
        f"mongodb://memgpt:{catalog.MONGODB_PASSWORD}@127.0.0.1:99999/",  # no such port
        f"mongodb://memgpt:{catalog.MONGODB_PASSWORD}@127.0.0.1:1/?authMechanism=NOPE",  # unknown mechanism
        f"mongodb://memgpt:{catalog.MONGODB_PASSWORD}@127.0.0.1:1/?tls=maybe",  # bad option value
        f"mongodb://memgpt:{catalog.MONGODB_PASSWORD}@",  # cut short
    ],
)
async def test_mongodb_errors_never_show_the_password(uri: str, caplog: pytest.LogCaptureFixture) -> None:
    store = MongoStore(uri, "memgpt", server_selection_timeout=0.3)
    with caplog.at_level(logging.DEBUG), pytest.raises(StoreError) as failed:
        await store.open()
    assert leaked(caplog.text, error_texts(failed.value), repr(store)) == []


# -- the command line, as a subprocess ------------------------------------------------
def cli_env(llm_server: FakeLLMServer, data: Path, **extra: str) -> dict[str, str]:
    env = base_env(llm_server.base_url, data, **SECRET_ENV)
    env.pop(LOG_SCAN_ENV, None)  # a subprocess must not write into the session's scan file
    env.update(MEMGPT_LOG_LEVEL="DEBUG", MEMGPT_LLM_MAX_RETRIES="0", **extra)
    return env


def outputs(result: subprocess.CompletedProcess[str], data: Path) -> list[str]:
    log = data / "memgpt-bot.log"
    return [result.stdout, result.stderr, log.read_text() if log.exists() else ""]


def test_cli_errors_show_no_secret(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    runs: dict[str, list[str]] = {}
    # A bad setting beside every secret: one line naming the setting.
    data = tmp_path / "bad-setting"
    bad = memgpt(
        "-v",
        "memory",
        "show",
        "--user",
        "alice",
        cwd=tmp_path,
        env=cli_env(llm_server, data, MEMGPT_CONTEXT_WINDOW="lots"),
    )
    assert bad.returncode != 0 and "MEMGPT_CONTEXT_WINDOW" in bad.stderr
    runs["bad setting"] = outputs(bad, data)
    # A MongoDB URI that cannot work: named without its password.
    data = tmp_path / "bad-uri"
    mongo = memgpt(
        "-v",
        "memory",
        "show",
        "--user",
        "alice",
        cwd=tmp_path,
        env=cli_env(llm_server, data, MONGODB_URI=f"mongodb://memgpt:{catalog.MONGODB_PASSWORD}@h:99999/"),
    )
    assert mongo.returncode != 0 and "memgpt:***@" in mongo.stderr
    runs["bad MongoDB URI"] = outputs(mongo, data)
    # Chat on SQLite with a server that refuses the key and quotes it back.
    llm_server.set_handler(lambda request: echoing(401))
    data = tmp_path / "chat"
    chat = memgpt(
        "-v", "chat", "--user", "alice", stdin="hello\n", cwd=tmp_path, env=cli_env(llm_server, data, MONGODB_URI="")
    )
    assert chat.returncode == 0 and "API key" in chat.stdout
    assert llm_server.raw_requests[-1].headers["authorization"] == f"Bearer {catalog.OPENAI_API_KEY}"
    runs["refused key"] = outputs(chat, data)
    # `run` with Slack credentials that Slack refuses (no Discord: it would go online).
    data = tmp_path / "run"
    with FakeSlack(bot_token=catalog.FAKE_SLACK_BOT_TOKEN) as slack:
        run = memgpt(
            "-v",
            "run",
            cwd=tmp_path,
            timeout=120,
            env=cli_env(llm_server, data, MONGODB_URI="", DISCORD_TOKEN="", SLACK_API_URL=slack.api_url),
        )
        assert slack.calls_to("auth.test")
    assert "SLACK_BOT_TOKEN" in run.stderr and "invalid_auth" in run.stderr
    runs["refused Slack token"] = outputs(run, data)
    assert {name: leaked(*texts) for name, texts in runs.items()} == {name: [] for name in runs}


# -- the session-wide capture and the scanner can fail ---------------------------------
def scanner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCANNER), *args], capture_output=True, text=True, timeout=60)


def plant(folder: Path, lines: Iterable[str], name: str = "session.log") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_the_scanner_finds_a_planted_secret_and_never_prints_it() -> None:
    # Outside the session's temporary folder: its *.log files end up in the
    # session's scan file, where a planted secret would fail CI.
    with tempfile.TemporaryDirectory(prefix="memgpt-scan-") as folder:
        root = Path(folder)
        clean = plant(root, ["INFO cli.main: settings {'openai_api_key': 'set'}", "DEBUG httpx: HTTP Request: POST"])
        assert scanner(str(clean)).returncode == 0
        for label, value in (
            ("SLACK_BOT_TOKEN", catalog.SLACK_BOT_TOKEN),
            ("MONGODB_PASSWORD", catalog.MONGODB_PASSWORD),
        ):
            dirty = plant(root / label, ["a clean line", f"DEBUG x: Authorization: Bearer {value} (oops)"])
            found = scanner(str(clean), str(dirty.parent))  # a folder: its *.log files
            assert found.returncode == 1
            assert f"{dirty}:2: {label}" in found.stdout
            assert value not in found.stdout + found.stderr
        # Extra values can be given, and are found percent-encoded too (as in a URL).
        extra = plant(root, ["GET /connect?password=p%40ss%20w%2Frd-extra-value"], "extra.log")
        assert scanner(str(extra)).returncode == 0
        found = scanner(str(extra), "--secret", "EXTRA=p@ss w/rd-extra-value")
        assert found.returncode == 1 and f"{extra}:1: EXTRA" in found.stdout
        # A capture that never ran is not a clean one.
        assert scanner(str(root / "missing.log")).returncode == 2


def test_the_session_capture_writes_every_record_at_debug() -> None:
    marker = f"log-scan-marker-{uuid.uuid4().hex}"
    active = os.environ.get(LOG_SCAN_ENV)
    if active:
        # This session is being captured: the marker must reach the file.
        logging.getLogger("tests.secrets").debug(marker)
        for handler in logging.getLogger().handlers:
            handler.flush()
        assert marker in capture_file(active).read_text(encoding="utf-8", errors="replace")
        return
    with tempfile.TemporaryDirectory(prefix="memgpt-scan-") as folder:
        target = Path(folder) / "capture.log"
        sub = Path(folder) / "tmp" / "data"
        sub.mkdir(parents=True)
        plant(sub, ["written by a subprocess"], "memgpt-bot.log")
        with session_log_capture(str(target), Path(folder) / "tmp") as capture:
            assert capture is not None
            logging.getLogger("some.library").setLevel(logging.NOTSET)
            logging.getLogger().setLevel(logging.WARNING)  # as code under test may leave it...
            capture.keep_debug()  # ...and as the per-test fixture restores it
            logging.getLogger("some.library").debug(marker)
        text = capture_file(str(target)).read_text()
        assert marker in text and "written by a subprocess" in text
        # And the scanner reads what the capture wrote.
        logging.getLogger("tests.secrets").debug("unrelated")
        assert scanner(str(capture_file(str(target)))).returncode == 0
