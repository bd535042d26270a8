"""Listening channels on Discord, through discord.py's real gateway and HTTP code
against the local stand-in (tests/fake_discord.py) and a real Runtime on
SQLite: a `listen` channel (DISCORD_LISTEN_CHANNELS; its threads too) keeps
every person's line and answers only mentions, with no LLM call for the rest;
a gateway that sends an event twice keeps it once; MESSAGE_UPDATE and
MESSAGE_DELETE apply; the notice is said once; `/channel` shows and sets the
mode for those with Manage Channels only; a restart keeps lines and mode; an
opted-out speaker is not kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import discord
import pytest
import yarl
from discord.gateway import DiscordWebSocket

from adapters.discord import DiscordAdapter, DiscordConfig
from bot.channels.listening import LISTENING_NOTICE
from bot.channels.port import ChannelRef
from bot.commands.catalog import CHANNEL_IN_DM, CHANNEL_NOT_MANAGER
from bot.errors import ConfigError
from bot.events import Place
from bot.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.fake_discord import FakeDiscord
from tests.fake_llm import FakeLLMServer, say
from tests.secrets_catalog import DISCORD_TOKEN

MANAGE_CHANNELS = 1 << 4
JSONDict = dict[str, Any]


@pytest.fixture(autouse=True)
def route_base() -> Iterator[None]:
    original, gateway = discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    yield
    discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = original, gateway
    assert isinstance(DiscordWebSocket.DEFAULT_GATEWAY, yarl.URL)


@pytest.fixture
def fake() -> Iterator[FakeDiscord]:
    with FakeDiscord(token=DISCORD_TOKEN) as stand_in:
        stand_in.alice = stand_in.add_user("alice")  # type: ignore[attr-defined]
        stand_in.bob = stand_in.add_user("bob")  # type: ignore[attr-defined]
        yield stand_in


Start = Callable[..., Awaitable[DiscordAdapter]]


@pytest.fixture
async def start(fake: FakeDiscord, make_runtime: RuntimeFactory, tmp_path: Path) -> AsyncIterator[Start]:
    running: list[tuple[DiscordAdapter, asyncio.Task[None]]] = []

    async def starting(runtime: Runtime | None = None, **env: str) -> DiscordAdapter:
        config = DiscordConfig.from_env(
            {
                "DISCORD_TOKEN": DISCORD_TOKEN,
                "DISCORD_API_URL": fake.api_url,
                "DISCORD_GATEWAY_URL": fake.gateway_url,
                "MEMGPT_CHANNEL_CONTEXT_MESSAGES": "0",
                **env,
            }
        )
        assert config is not None
        adapter = DiscordAdapter(runtime or await make_runtime(data_dir=tmp_path / "data"), config)
        task = asyncio.create_task(adapter.start())
        running.append((adapter, task))
        await asyncio.wait_for(adapter.wait_ready(), timeout=30)
        return adapter

    yield starting
    for adapter, task in running:
        await adapter.close(grace=5)
        await asyncio.wait_for(task, timeout=30)


async def eventually(condition: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def key(user: JSONDict) -> str:
    return f"discord:{user['id']}"


def people(fake: FakeDiscord) -> tuple[JSONDict, JSONDict]:
    return fake.alice, fake.bob  # type: ignore[attr-defined]


async def texts_of(adapter: DiscordAdapter, user: JSONDict) -> list[str]:
    return [line.text for line in await adapter.bot.channel_memory.speaker_lines(key(user))]  # type: ignore[attr-defined]


def notices(fake: FakeDiscord) -> list[str]:
    return [m["channel_id"] for m in fake.all_bot_messages() if m["content"] == LISTENING_NOTICE]


def answers(fake: FakeDiscord) -> list[str]:
    found = []
    for callback in fake.interaction_callbacks:
        data = callback.get("data") or {}
        if callback.get("type") == "followup" and int(data.get("flags") or 0) & 64:
            found.append(str(data.get("content", "")))
    return found


async def command(fake: FakeDiscord, user: JSONDict, channel: JSONDict | None, mode: str = "", **extra: Any) -> str:
    before = len(answers(fake))
    options = {"mode": mode} if mode else {}
    fake.slash_command(user, "channel", channel, **extra, **options)

    async def answered() -> bool:
        return len(answers(fake)) > before

    await eventually(answered)
    return answers(fake)[before]


async def test_a_listening_channel_keeps_its_lines_answers_only_mentions_and_applies_edits_and_deletions(
    fake: FakeDiscord, start: Start, llm_server: FakeLLMServer
) -> None:
    alice, bob = people(fake)
    general = fake.public_channel
    adapter = await start(DISCORD_LISTEN_CHANNELS=general["id"])
    memory = adapter.bot.channel_memory  # type: ignore[attr-defined]
    llm_server.script(say("It moved to May 3."))

    first = fake.post(general["id"], alice, "The launch moves to May 3, code name Bluebird.")
    fake.post(fake.thread["id"], bob, "sounds good")  # a thread of a listening channel listens
    fake.redeliver(first)  # the gateway sends it twice: kept once
    fake.mention(general, bob, "when is the launch?")

    async def answered() -> bool:
        return len(fake.bot_messages(general)) == 2

    await eventually(answered)
    assert sorted(m["content"] for m in fake.bot_messages(general)) == sorted(
        [LISTENING_NOTICE, f"<@{bob['id']}> It moved to May 3."]
    )
    assert len(llm_server.requests) == 1  # only the mention
    [line] = await memory.speaker_lines(key(alice))
    assert (line.text, line.speaker_name, line.message_id) == (
        "The launch moves to May 3, code name Bluebird.",
        "alice",
        first["id"],
    )
    assert (line.channel, line.place) == (f"discord:{fake.guild_id}:{general['id']}", f"public:{general['id']}")
    assert line.said_at == discord.utils.snowflake_time(int(first["id"]))  # Discord's time of the message
    assert await texts_of(adapter, bob) == ["sounds good", "@MemBot when is the launch?"]
    assert await adapter.bot.store.find_agent(key(alice)) is None  # type: ignore[attr-defined]

    edited = first | {"content": "The launch moves to May 10.", "edited_timestamp": datetime.now(UTC).isoformat()}
    fake.dispatch("MESSAGE_UPDATE", edited)
    second = fake.post(general["id"], alice, "bring the slides")

    async def kept_second() -> bool:
        return len(await texts_of(adapter, alice)) == 2

    await eventually(kept_second)
    fake.dispatch("MESSAGE_DELETE", {"id": second["id"], "channel_id": general["id"], "guild_id": fake.guild_id})

    async def applied() -> bool:
        return await texts_of(adapter, alice) == ["The launch moves to May 10."]

    await eventually(applied)
    [line] = await memory.speaker_lines(key(alice))
    assert line.edited_at is not None
    assert notices(fake) == [general["id"]]  # said once
    assert len(llm_server.requests) == 1


async def test_channel_sets_the_mode_for_managers_an_opt_out_is_respected_and_a_restart_keeps_it(
    fake: FakeDiscord, start: Start, make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    alice, bob = people(fake)
    general = fake.public_channel
    adapter = await start()
    await adapter.bot.channel_memory.set_consent(key(bob), False)  # type: ignore[attr-defined]

    fake.post(general["id"], alice, "before anyone set a mode")
    assert "**mention**" in await command(fake, bob, general)
    assert await texts_of(adapter, alice) == []
    assert await command(fake, bob, general, "listen") == CHANNEL_NOT_MANAGER
    assert await command(fake, bob, None) == CHANNEL_IN_DM
    assert "**listen**" in await command(fake, alice, general, "listen", permissions=MANAGE_CHANNELS)

    async def noticed() -> bool:
        return notices(fake) == [general["id"]]

    await eventually(noticed)
    fake.post(general["id"], bob, "my phone is 555-0199")  # opted out: not kept
    fake.post(general["id"], alice, "the launch is on May 3")

    async def kept() -> bool:
        return await texts_of(adapter, alice) == ["the launch is on May 3"]

    await eventually(kept)
    assert await texts_of(adapter, bob) == []

    await adapter.close(grace=5)
    again = await start(await make_runtime(data_dir=tmp_path / "data"))
    ref = ChannelRef("discord", fake.guild_id, Place("public", general["id"]))
    assert await again.bot.channel_mode(ref, "mention") == "listen"
    assert await texts_of(again, alice) == ["the launch is on May 3"]
    fake.post(general["id"], alice, "and the venue is the mill")

    async def kept_again() -> bool:
        return len(await texts_of(again, alice)) == 2

    await eventually(kept_again)
    assert notices(fake) == [general["id"]]
    assert llm_server.requests == []


def test_the_listening_setting() -> None:
    config = DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_LISTEN_CHANNELS": "123, 456,"})
    assert config is not None and config.listen_channels == {123, 456}
    with pytest.raises(ConfigError, match="DISCORD_LISTEN_CHANNELS"):
        DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_LISTEN_CHANNELS": "#general"})
