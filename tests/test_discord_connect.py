"""Discord unreachable at start: the adapter retries with backoff, saying so,
instead of stopping; DISCORD_API_URL points discord.py at another REST base and
DISCORD_GATEWAY_URL at another gateway (tests/fake_discord.py serves both)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator

import discord
import pytest
import yarl
from discord.gateway import DiscordWebSocket

from adapters.discord import DiscordAdapter, DiscordConfig, intents
from adapters.discord.client import build_client, run_client
from bot.errors import ConfigError
from tests.fake_discord import FakeDiscord
from tests.secrets_catalog import DISCORD_TOKEN


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens there once closed


@pytest.fixture(autouse=True)
def route_base() -> Iterator[None]:
    original, gateway = discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    yield
    discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = original, gateway


@pytest.fixture
def fake_discord() -> Iterator[FakeDiscord]:
    with FakeDiscord(token=DISCORD_TOKEN) as fake:
        yield fake


def test_discord_api_url_is_read_checked_and_used(closed_port: int) -> None:
    config = DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_API_URL": f"http://127.0.0.1:{closed_port}/api/"})
    assert config is not None and config.api_url == f"http://127.0.0.1:{closed_port}/api"
    DiscordAdapter(object(), config)  # type: ignore[arg-type]
    assert discord.http.Route("GET", "/gateway/bot").url == f"http://127.0.0.1:{closed_port}/api/gateway/bot"
    # The REST base alone leaves the gateway Discord's (a REST proxy in front of the rate limits).
    assert DiscordWebSocket.DEFAULT_GATEWAY == yarl.URL("wss://gateway.discord.gg/")
    with pytest.raises(ConfigError, match="DISCORD_API_URL"):
        DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_API_URL": "discord.example"})


def test_discord_gateway_url_is_read_and_checked() -> None:
    config = DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_GATEWAY_URL": " ws://127.0.0.1:9/gateway/ "})
    assert config is not None and config.gateway_url == "ws://127.0.0.1:9/gateway"
    with pytest.raises(ConfigError, match=r"DISCORD_GATEWAY_URL='https://gateway.example': must be an ws:// or wss://"):
        DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_GATEWAY_URL": "https://gateway.example"})


@contextlib.asynccontextmanager
async def connected(client: discord.Client) -> AsyncIterator[asyncio.Task[None]]:
    """`client` running (run_client) inside the block, closed after it."""
    closing = False
    task = asyncio.create_task(run_client(client, DISCORD_TOKEN, lambda: closing, first=0.05))
    try:
        yield task
    finally:
        closing = True
        await client.close()
        await asyncio.wait_for(task, timeout=30)


@pytest.mark.parametrize("shards", ["", "auto", "1"])
async def test_both_clients_dial_the_configured_gateway(
    fake_discord: FakeDiscord, closed_port: int, shards: str
) -> None:
    # /gateway/bot names a dead gateway: the sharded client without a count would take it.
    fake_discord.gateway_bot_url = f"ws://127.0.0.1:{closed_port}/"
    env = {
        "DISCORD_TOKEN": DISCORD_TOKEN,
        "DISCORD_API_URL": fake_discord.api_url,
        "DISCORD_GATEWAY_URL": fake_discord.gateway_url,
        "DISCORD_SHARD_COUNT": shards,
    }
    config = DiscordConfig.from_env(env)
    assert config is not None
    client = build_client(config)
    assert isinstance(client, discord.AutoShardedClient) == bool(shards)
    async with connected(client):
        await asyncio.wait_for(client.wait_until_ready(), timeout=60)
        assert fake_discord.identifies == 1
        assert client.user is not None and str(client.user.id) == fake_discord.bot_user["id"]
        assert [guild.name for guild in client.guilds] == ["Test Server"]
        # The heartbeat discord.py sends on HELLO was acknowledged; frames were zlib-stream.
        assert any(frame.get("op") == 1 for frame in fake_discord.frames_received)


async def test_a_gateway_unreachable_at_start_is_retried_until_it_answers(
    fake_discord: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the fix: `'NoneType' object has no attribute 'sequence'`, the adapter stopped."""
    fake_discord.down(api=False, gateway=True)
    env = {"DISCORD_TOKEN": DISCORD_TOKEN, "DISCORD_API_URL": fake_discord.api_url}
    config = DiscordConfig.from_env(env | {"DISCORD_GATEWAY_URL": fake_discord.gateway_url})
    assert config is not None
    client = build_client(config)
    with caplog.at_level(logging.WARNING, logger="adapters.discord"):
        async with connected(client) as task:
            while sum("cannot reach Discord's gateway" in r.getMessage() for r in caplog.records) < 2:
                assert not task.done(), f"the adapter stopped: {task.exception() if not task.cancelled() else ''}"
                await asyncio.sleep(0.05)
            fake_discord.up()
            await asyncio.wait_for(client.wait_until_ready(), timeout=60)
            assert fake_discord.identifies == 1
    said = [record.getMessage() for record in caplog.records if "gateway" in record.getMessage()]
    delays = [float(line.rsplit("retrying in ", 1)[1].split()[0]) for line in said]
    assert delays == sorted(delays) and len(delays) >= 2


async def test_an_unreachable_discord_is_retried_with_backoff_until_closed(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    discord.http.Route.BASE = f"http://127.0.0.1:{closed_port}/api/v10"
    client = discord.Client(intents=intents())
    closing = False
    with caplog.at_level(logging.WARNING, logger="adapters.discord"):
        task = asyncio.create_task(run_client(client, "token", lambda: closing, first=0.05))

        def said() -> list[str]:
            # The adapter's lines only: discord.py warns once per process about voice
            # support when the first Client is made, whichever test makes it.
            return [record.getMessage() for record in caplog.records if record.name.startswith("adapters.discord")]

        for _ in range(200):
            if len(said()) >= 3 or task.done():
                break
            await asyncio.sleep(0.05)
        assert not task.done(), "the adapter stopped instead of retrying"
        closing = True
        await client.close()
        await asyncio.wait_for(task, timeout=10)
    lines = said()
    assert len(lines) >= 3 and all("cannot reach Discord" in line for line in lines), lines
    delays = [float(line.rsplit("retrying in ", 1)[1].split()[0]) for line in lines]
    assert delays == sorted(delays)  # backing off, never faster


async def test_the_gateway_session_resumes_after_a_cut_and_identifies_after_an_invalid_session(
    fake_discord: FakeDiscord,
) -> None:
    env = {"DISCORD_TOKEN": DISCORD_TOKEN, "DISCORD_API_URL": fake_discord.api_url}
    config = DiscordConfig.from_env(env | {"DISCORD_GATEWAY_URL": fake_discord.gateway_url})
    assert config is not None
    client = build_client(config)
    resumed, loop = asyncio.Event(), asyncio.get_running_loop()

    async def on_resumed() -> None:
        resumed.set()

    client.event(on_resumed)
    async with connected(client):
        await asyncio.wait_for(client.wait_until_ready(), timeout=60)
        await loop.run_in_executor(None, fake_discord.cut_connections)
        await asyncio.wait_for(resumed.wait(), timeout=60)  # RESUME (op 6) answered with RESUMED
        assert (fake_discord.identifies, fake_discord.resumes) == (1, 1)
        await loop.run_in_executor(None, fake_discord.invalidate_sessions)
        await loop.run_in_executor(None, lambda: fake_discord.wait_until(lambda: fake_discord.identifies == 2, 60))
