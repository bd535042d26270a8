"""`memgpt-bot run`: which adapters start, which are skipped and why."""

from __future__ import annotations

from pathlib import Path

from tests.fake_llm import FakeLLMServer
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
