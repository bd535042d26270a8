"""Each member's say over channel memory, through the runtime on real stores:
the race between an opt-out and a line being kept at the same moment,
retention (MEMGPT_CHANNEL_RETENTION_DAYS) and its periodic sweep, and what a
whole forget does with an "off" choice. The scans of what forgetting leaves
are in tests/test_channel_forget_scan.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from bot.commands.catalog import run
from bot.commands.model import Caller
from bot.forgetting.retention import ChannelRetention
from bot.runtime import Runtime
from memory.channels import ChannelMemory
from memory.embeddings import Embedder
from memory.sqlite.store import SQLiteStore
from memory.types import ChannelLine, utc_now
from tests.conftest import make_settings
from tests.fake_llm import FakeLLMServer
from tests.test_forget_scan import open_runtime

CHANNEL = "slack:T9:C7"
ALICE = Caller("slack", "T9:UALICE")


def line(message_id: str, *, days_ago: float = 0, speaker: str = ALICE.key) -> ChannelLine:
    return ChannelLine(
        CHANNEL, message_id, speaker, "alice", f"line {message_id}", utc_now() - timedelta(days=days_ago), "public:C7"
    )


@pytest.fixture
async def runtime(tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder) -> Runtime:
    settings = make_settings(tmp_path / "data", channel_retention_days=30)
    opened = await open_runtime(settings, SQLiteStore(tmp_path / "data" / "memgpt.sqlite3"), llm_server, embedder)
    yield opened  # type: ignore[misc]
    await opened.close(close_embedder=False)


class SlowAppend:
    """Holds a keep between its consent check and its append, for the opt-out to run meanwhile."""

    def __init__(self, memory: ChannelMemory) -> None:
        self.memory, self.checked, self.go = memory, asyncio.Event(), asyncio.Event()
        self.keep = memory.keep

    async def __call__(self, kept: ChannelLine) -> bool:
        self.checked.set()
        await self.go.wait()
        return await self.keep(kept)


async def test_an_opt_out_while_a_line_is_being_kept_leaves_no_line(runtime: Runtime) -> None:
    memory = runtime.channel_memory
    assert await memory.keep_with_consent(line("1"))
    slow = SlowAppend(memory)
    memory.keep = slow  # type: ignore[method-assign]
    keeping = asyncio.create_task(memory.keep_with_consent(line("2")))
    await slow.checked.wait()  # it saw no opt-out yet
    answer = await run(runtime, "memory", ALICE, {"channels": "off"})
    assert "1 message and 0 notes credited to you" in answer.text
    slow.go.set()  # its append lands after the deletion...
    assert not await keeping  # ...and its second check takes it out again
    assert await memory.speaker_counts(ALICE.key) == {}
    assert await memory.consent([ALICE.key]) == {ALICE.key: False}


async def test_a_whole_forget_keeps_an_off_choice_and_drops_an_on(runtime: Runtime) -> None:
    memory = runtime.channel_memory
    await memory.set_consent(ALICE.key, False)
    assert not await runtime.forget(ALICE.key)  # nothing held: the choice is not "anything"
    assert await memory.consent([ALICE.key]) == {ALICE.key: False}  # forgetting her does not start keeping her
    await memory.set_consent(ALICE.key, True)
    assert await memory.keep_with_consent(line("1"))
    assert await runtime.forget(ALICE.key)
    assert await memory.consent([ALICE.key]) == {} and await memory.speaker_counts(ALICE.key) == {}


async def test_retention_deletes_lines_older_than_the_setting(runtime: Runtime) -> None:
    memory = runtime.channel_memory
    for message_id, days_ago in (("old", 31), ("recent", 29)):
        assert await memory.keep(line(message_id, days_ago=days_ago))
    assert runtime.retention.keep_for == timedelta(days=30)
    assert await runtime.retention.sweep() == 1
    assert [kept.message_id for kept in await memory.speaker_lines(ALICE.key)] == ["recent"]
    # Thirty days on, the recent one goes too.
    assert await runtime.retention.sweep(utc_now() + timedelta(days=2)) == 1
    assert await memory.speaker_counts(ALICE.key) == {}
    assert await ChannelRetention(memory, 0).sweep(utc_now() + timedelta(days=9_000)) == 0  # 0: kept


async def test_the_sweep_runs_while_the_bot_is_connected(runtime: Runtime) -> None:
    memory = runtime.channel_memory
    assert await memory.keep(line("old", days_ago=40))
    runtime.retention.every = timedelta(seconds=0.05)
    runtime.connect(None, None)  # disconnected: no sweep
    await asyncio.sleep(0.2)
    assert await memory.speaker_counts(ALICE.key) == {CHANNEL: 1}
    runtime.connect(lambda *_: asyncio.sleep(0), None)  # type: ignore[arg-type]  # as `memgpt-bot run` does
    for _ in range(100):
        if not await memory.speaker_counts(ALICE.key):
            break
        await asyncio.sleep(0.05)
    assert await memory.speaker_counts(ALICE.key) == {}
    assert await memory.keep(line("older", days_ago=50))
    runtime.connect(None, None)
    await asyncio.sleep(0.2)
    assert await memory.speaker_counts(ALICE.key) == {CHANNEL: 1}
