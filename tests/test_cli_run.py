"""`memgpt-bot run`: which adapters start, which are skipped and why."""

from __future__ import annotations

from pathlib import Path

from tests.fake_llm import FakeLLMServer
from tests.fake_slack import FakeSlack
from tests.test_cli import base_env, failed, memgpt


def test_run_with_no_platform_configured_explains_and_exits(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    env = base_env(llm_server.base_url, tmp_path / "data")
    for name in list(env):
        if name.startswith(("DISCORD_", "SLACK_")):
            del env[name]
    result = memgpt("run", env=env, cwd=tmp_path)
    assert "discord: skipped: DISCORD_TOKEN is not set" in result.stderr
    assert "slack: skipped: SLACK_BOT_TOKEN is not set" in result.stderr
    assert "no chat platform is configured" in failed(result)


def test_run_without_api_key_is_one_clear_error(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    env = base_env(llm_server.base_url, tmp_path / "data", DISCORD_TOKEN="x")
    del env["OPENAI_API_KEY"]
    assert "OPENAI_API_KEY" in failed(memgpt("run", env=env, cwd=tmp_path))


def test_run_exits_non_zero_when_every_adapter_stops(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    """A supervisor (systemd, Docker) restarts a bot that exits with an error, not one that exits 0."""
    with FakeSlack(bot_token="xoxb-the-right-token") as slack:
        env = base_env(
            llm_server.base_url,
            tmp_path / "data",
            SLACK_BOT_TOKEN="xoxb-a-wrong-token",
            SLACK_SIGNING_SECRET="s",
            SLACK_API_URL=slack.api_url,
            SLACK_HTTP_PORT="0",
        )
        for name in ("DISCORD_TOKEN", "SLACK_APP_TOKEN", "MONGODB_URI"):
            env.pop(name, None)
        result = memgpt("run", env=env, cwd=tmp_path)
    assert "slack: stopped: Slack rejected SLACK_BOT_TOKEN (auth.test: invalid_auth)" in result.stderr
    assert "every adapter stopped: slack: Slack rejected SLACK_BOT_TOKEN" in failed(result)
