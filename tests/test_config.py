"""Settings: the store they select, and what of them may be logged."""

from __future__ import annotations

from pathlib import Path

from bot.config import Settings
from bot.runtime import default_store
from memory.mongo.store import MongoStore
from memory.sqlite.store import SQLiteStore


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
