"""Settings: the store they select, and what of them may be logged."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from bot.config import ConfigError, Settings, read_env_file
from bot.runtime import default_store
from memory.mongo.store import MongoStore
from memory.sqlite.store import SQLiteStore
from memory.tokens import load_encoder
from memory.working_context import DEFAULT_PERSONA


def test_mongodb_uri_selects_mongodb_and_sqlite_is_the_default(tmp_path: Path) -> None:
    assert isinstance(default_store(Settings(data_dir=tmp_path)), SQLiteStore)
    chosen = default_store(Settings(data_dir=tmp_path, mongodb_uri="mongodb://127.0.0.1:1/", mongodb_db="bot"))
    assert isinstance(chosen, MongoStore)


def test_redacted_settings_hide_keys_and_the_mongodb_password(tmp_path: Path) -> None:
    uri = "mongodb://bot:pw-secret-456@db1/"
    settings = Settings(openai_api_key="sk-secret-123", mongodb_uri=uri, data_dir=tmp_path)
    shown = str(settings.redacted())
    assert "sk-secret-123" not in shown and "pw-secret-456" not in shown
    assert settings.redacted()["openai_api_key"] == "set" and settings.redacted()["mongodb_uri"] == "set"
    assert Settings(data_dir=tmp_path).redacted()["mongodb_uri"] == "not set"


# -- validation at start-up: one line naming the variable, the value and what is allowed --
@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("MEMGPT_SEARCH_PAGE_SIZE", "0", "from 1 to 50"),
        ("MEMGPT_LLM_MAX_RETRIES", "-1", "from 0 to 20"),
        ("MEMGPT_LLM_TIMEOUT", "-1", "from 1 to 3600"),
        ("MEMGPT_LOG_LEVEL", "verbose", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("MEMGPT_PERSONA_LIMIT", "10", f"from {len(DEFAULT_PERSONA)} to 20000"),
        ("MEMGPT_RESPONSE_RESERVE", "100000", "at most half the context window"),
        ("MEMGPT_CONTEXT_WINDOW", "lots", "a whole number from 1024 up"),
        ("MEMGPT_WARNING_THRESHOLD", "0", "above 0 and at most 1"),
        ("MEMGPT_METRICS_PORT", "70000", "from 1 to 65535, or 0 (off)"),
        ("MEMGPT_LEASES", "sometimes", "auto, on or off"),
        ("MEMGPT_MAX_REMINDERS", "0", "at least 1"),
        ("MEMGPT_WARM_UP", "later", "must be on or off"),
    ],
)
def test_a_setting_that_cannot_work_is_refused_at_start_naming_it(name: str, value: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_mapping({name: value})
    message = str(refused.value)
    assert name in message and value in message and allowed in message and "\n" not in message


def test_every_setting_is_read_once_into_one_settings_object(tmp_path: Path) -> None:
    env = {
        "MEMGPT_MODEL": "llama3.1:8b",
        "MEMGPT_LEASES": "on",
        "MEMGPT_MAX_REMINDERS": "3",
        "MEMGPT_LOG_LEVEL": "debug",
        "MEMGPT_WARM_UP": "off",
        "DISCORD_TOKEN": "discord-token-value",
    }
    settings = Settings.from_mapping(env)
    assert settings.context_window == 131_072 and settings.daily_token_budget == 50 * 131_072
    assert settings.response_reserve == 1_024 and settings.log_level == "DEBUG" and not settings.warm_up
    assert settings.leases.mode == "on" and settings.checkins.max_reminders == 3
    # The adapters read their settings from here, never from os.environ.
    assert settings.environment["DISCORD_TOKEN"] == "discord-token-value"
    assert "discord-token-value" not in repr(settings) and "environment" not in settings.redacted()


def test_a_small_window_is_refused_with_the_smallest_that_works(tmp_path: Path) -> None:
    settings = Settings.from_mapping({"MEMGPT_CONTEXT_WINDOW": "1024"})
    with pytest.raises(ConfigError, match=r"MEMGPT_CONTEXT_WINDOW=1024: too small .* use at least (\d+)") as refused:
        settings.check_window(fixed_prompt_tokens=1_400)
    smallest = int(str(refused.value).split("use at least ")[1].split()[0])
    Settings.from_mapping({"MEMGPT_CONTEXT_WINDOW": str(smallest)}).check_window(fixed_prompt_tokens=1_400)


def test_the_env_file_is_read_under_the_environment_and_a_bad_line_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / "settings.env"
    env_file.write_text("# comment\nMEMGPT_MAX_STEPS=5\nexport MEMGPT_MODEL='gpt-4'\n", encoding="utf-8")
    monkeypatch.delenv("MEMGPT_MAX_STEPS", raising=False)
    monkeypatch.setenv("MEMGPT_MODEL", "gpt-4o")  # the environment wins over the file
    settings = Settings.from_env(env_file)
    assert settings.max_steps_per_event == 5 and settings.model == "gpt-4o"
    assert "MEMGPT_MAX_STEPS" not in os.environ  # read, not exported into the process
    env_file.write_text("MEMGPT_MAX_STEPS=5\nthis line is not a setting\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{env_file} line 2: not a setting: 'this line is not a setting'"):
        Settings.from_env(env_file)
    assert read_env_file(tmp_path / "missing.env") == {}


def test_the_default_model_counts_with_its_own_tokenizer_offline(caplog: pytest.LogCaptureFixture) -> None:
    load_encoder.cache_clear()
    with caplog.at_level(logging.WARNING, logger="memory.tokens"):
        encoder = load_encoder(Settings().model)
    assert encoder.name == "o200k_base" and caplog.records == []
    # o200k_base, not cl100k_base: the two split this differently.
    assert encoder.encode_ordinary("hello world, café") == [24912, 2375, 11, 30469]
    assert load_encoder("llama3").name == "cl100k_base"
