"""Shared fixtures: a real local LLM server, real SQLite files, real embeddings."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Debounce waits before each answer: off unless a test turns it on (tests/test_debounce.py).
os.environ.setdefault("MEMGPT_DEBOUNCE_SECONDS", "0")

from bot.config import Settings
from bot.llm import LLMClient
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.sqlite.store import SQLiteStore
from tests import secrets_catalog
from tests.fake_llm import FakeLLMServer, start_fake_llm
from tests.log_capture import ENV as LOG_SCAN_ENV
from tests.log_capture import SessionLogCapture, session_log_capture

TEST_MODEL = "test-model"

# The longest tests (each a minute or more on a busy 2-core machine), started
# first so that the two workers (pytest-xdist) finish together instead of one
# of them running a long test alone at the end.
HEAVY = (
    "tests/test_crash_harness.py",
    "tests/test_llm_fault_property.py::test_any_llm_fault_sequence",
    "tests/test_isolation.py",
    "tests/test_multiprocess.py",
    "tests/test_store_faults.py",
    "tests/test_sources.py::test_cli_sources",
    "tests/test_harnesses.py",
    "tests/test_hybrid.py",
    "tests/test_loader.py",
    "tests/test_real_servers.py",
    "tests/test_qa_bench.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(HEAVY))  # stable: the order stays otherwise


@pytest.fixture(scope="session", autouse=True)
def _session_log_scan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionLogCapture | None]:
    """With MEMGPT_LOG_SCAN_FILE set, every log record of the session goes to
    that file, for scripts/scan_logs_for_secrets.py (see tests/log_capture.py)."""
    with session_log_capture(os.environ.get(LOG_SCAN_ENV), tmp_path_factory.getbasetemp()) as capture:
        yield capture


@pytest.fixture(autouse=True)
def _log_scan_level(_session_log_scan: SessionLogCapture | None) -> None:
    if _session_log_scan is not None:
        _session_log_scan.keep_debug()


@pytest.fixture(scope="session")
def llm_server_session() -> Iterator[FakeLLMServer]:
    server = start_fake_llm()
    yield server
    server.stop()


@pytest.fixture
def llm_server(llm_server_session: FakeLLMServer) -> Iterator[FakeLLMServer]:
    llm_server_session.reset()
    yield llm_server_session
    llm_server_session.reset()


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    # One model per test session; the Embedder re-binds itself to each test's loop.
    return Embedder()


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    settings = Settings(
        openai_api_key=secrets_catalog.OPENAI_API_KEY,  # the logs of the session are scanned for it
        model=TEST_MODEL,
        context_window=8_192,
        data_dir=data_dir,
        llm_timeout=5.0,
        llm_max_retries=2,
        response_reserve=256,
        # Off unless a test turns them on: many tests send a burst of turns.
        rate_limit_per_minute=0,
        daily_token_budget=0,
        debounce_seconds=0.0,
    )
    for name, value in overrides.items():
        setattr(settings, name, value)
    settings.validate()
    return settings


RuntimeFactory = Callable[..., Awaitable[Runtime]]


@pytest.fixture
async def make_runtime(tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder) -> AsyncIterator[RuntimeFactory]:
    """Build runtimes on a real SQLite file in tmp_path, talking to the local
    LLM server through the real openai client. Several runtimes may share a
    data directory (a 'restart')."""
    created: list[Runtime] = []

    async def factory(data_dir: Path | None = None, **overrides: Any) -> Runtime:
        settings = make_settings(data_dir or tmp_path / "data", **overrides)
        llm = LLMClient(
            settings.model,
            api_key=settings.openai_api_key,
            base_url=llm_server.base_url,
            timeout=settings.llm_timeout,
            max_retries=settings.llm_max_retries,
        )
        store = SQLiteStore(Path(settings.data_dir) / "memgpt.sqlite3")
        runtime = await Runtime.create(settings, store=store, llm=llm, embedder=embedder)
        created.append(runtime)
        return runtime

    yield factory
    for runtime in created:
        await runtime.close(close_embedder=False)
