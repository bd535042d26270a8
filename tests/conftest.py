"""Shared fixtures: a real local LLM server, real SQLite files, real embeddings."""

from __future__ import annotations

import os
import sys
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

# The longest tests, longest first (a minute or more each on a busy 2-core
# machine). The scheduler below hands out one test at a time, in this order, to
# whichever worker is free, so the long ones start first and end together with
# the many short ones. (pytest-xdist's default "load" mode sends each worker a
# block of consecutive tests: every heavy test landed on the first worker, one
# after another, and the suite took 12 minutes however many workers ran.)
HEAVY = (
    "tests/test_crash_harness.py::test_sigkill_at_random_points",
    "tests/test_real_servers.py",
    "tests/test_llm_fault_property.py::test_any_llm_fault_sequence",
    "tests/test_isolation.py",
    "tests/test_store_faults.py::test_mongodb_unreachable_and_back",
    "tests/test_multiprocess.py::test_two_processes_answer",
    "tests/test_crash_harness.py",
    "tests/test_multiproc_harness.py",
    "tests/test_store_faults.py",
    "tests/test_harnesses.py",
    "tests/test_loader.py",
    "tests/test_multiprocess.py",
    "tests/conformance/test_adapters.py",
    "tests/test_cli.py",
    "tests/test_sources.py::test_cli_sources",
    "tests/test_hybrid.py",
    "tests/test_qa_bench.py",
)
# Run on one worker, one after another: the real-server tests share one pair of
# llama.cpp servers (started once per worker), and two CPU models at once would
# only slow each other down on two cores.
TOGETHER = ("tests/test_real_servers.py",)


def heaviness(item: pytest.Item) -> int:
    """The rank of the item's first HEAVY prefix; everything else after, in its own order."""
    return next((rank for rank, prefix in enumerate(HEAVY) if item.nodeid.startswith(prefix)), len(HEAVY))


def pytest_configure(config: pytest.Config) -> None:
    # The README's test command installs with `uv pip install`, which (like `pip install
    # --no-compile`) compiles no bytecode at install (for every package, torch's CUDA build
    # among them, that was about 45 of pip's 115 CPU-s): Python compiles a module the first
    # time it is imported and keeps the result. Unless PYTHONDONTWRITEBYTECODE says not to
    # keep it: then every process the suite starts (workers, fork servers, bots, CLIs) would
    # compile torch and transformers from source again, 7 CPU-s each. This session and the
    # processes it starts keep what they compile. (Here, before pytest-xdist starts its
    # workers with this environment.)
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=heaviness)  # stable: the order stays otherwise


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """One test (or one TOGETHER file) at a time to the first free worker, in
    collection order. (The xdist_group mark would do this, but pytest-xdist
    3.8's loadgroup cannot rename node ids under pytest 9.2: the mark is ignored.)"""
    from xdist.scheduler import LoadScopeScheduling

    class OneAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((prefix for prefix in TOGETHER if nodeid.startswith(prefix)), nodeid)

    config.option.loadscopereorder = False  # keep the order above: longest first
    return OneAtATime(config, log)


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
        # Generous: with two CPU hogs beside the suite the scripted server once took
        # over 5 s to answer, the client re-sent, and the retry found the script spent.
        # Tests about timeouts set their own.
        llm_timeout=60.0,
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
    LLM server (or `openai_base_url`, when a test sets one) through the real
    openai client. Several runtimes may share a data directory (a 'restart')."""
    created: list[Runtime] = []

    async def factory(data_dir: Path | None = None, **overrides: Any) -> Runtime:
        settings = make_settings(data_dir or tmp_path / "data", **overrides)
        llm = LLMClient(
            settings.model,
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url or llm_server.base_url,
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
