"""Discord unreachable at start: the adapter retries with backoff, saying so,
instead of stopping; DISCORD_API_URL points discord.py at another REST base."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import discord
import pytest

from adapters.discord import DiscordAdapter, DiscordConfig, intents
from adapters.discord.client import run_client
from bot.config import ConfigError


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens there once closed


@pytest.fixture(autouse=True)
def route_base() -> Iterator[None]:
    original = discord.http.Route.BASE
    yield
    discord.http.Route.BASE = original


def test_discord_api_url_is_read_checked_and_used(closed_port: int) -> None:
    config = DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_API_URL": f"http://127.0.0.1:{closed_port}/api/"})
    assert config is not None and config.api_url == f"http://127.0.0.1:{closed_port}/api"
    DiscordAdapter(object(), config)  # type: ignore[arg-type]
    assert discord.http.Route("GET", "/gateway/bot").url == f"http://127.0.0.1:{closed_port}/api/gateway/bot"
    with pytest.raises(ConfigError, match="DISCORD_API_URL"):
        DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_API_URL": "discord.example"})


async def test_an_unreachable_discord_is_retried_with_backoff_until_closed(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    discord.http.Route.BASE = f"http://127.0.0.1:{closed_port}/api/v10"
    client = discord.Client(intents=intents())
    closing = False
    with caplog.at_level(logging.WARNING, logger="adapters.discord"):
        task = asyncio.create_task(run_client(client, "token", lambda: closing, first=0.05))
        for _ in range(200):
            if len(caplog.records) >= 3 or task.done():
                break
            await asyncio.sleep(0.05)
        assert not task.done(), "the adapter stopped instead of retrying"
        closing = True
        await client.close()
        await asyncio.wait_for(task, timeout=10)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) >= 3 and all("cannot reach Discord" in line for line in said)
    delays = [float(line.rsplit("retrying in ", 1)[1].split()[0]) for line in said]
    assert delays == sorted(delays)  # backing off, never faster
