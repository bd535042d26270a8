"""The Discord connection: the discord.py client (plain or sharded) with only
the intents the adapter uses and the configured REST base and gateway, logging
in and connecting it (retrying with backoff while Discord's API or gateway
cannot be reached), and publishing the slash commands once logged in. What the events mean is the adapter's business
(adapters/discord/adapter.py), not this module's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import discord
import yarl
from discord import app_commands
from discord.gateway import DiscordWebSocket

from adapters.discord.config import DiscordConfig

log = logging.getLogger(__name__)


def intents() -> discord.Intents:
    """Only what the adapter uses. message_content and members are privileged: they must
    also be switched on in the Developer Portal (Bot → Privileged Gateway Intents)."""
    wanted = discord.Intents.none()
    wanted.guilds = True  # channel and server names, the bot's own role
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True
    wanted.members = True  # on_member_join
    return wanted


class ShardedClient(discord.AutoShardedClient):
    """discord.py's sharded client, dialing the configured gateway: without a shard
    count it would take the address `/gateway/bot` answers (Discord's own, through a
    REST proxy), with one its default gateway."""

    gateway: yarl.URL | None = None

    async def launch_shard(self, gateway: yarl.URL, shard_id: int, *, initial: bool = False) -> None:
        await super().launch_shard(self.gateway or gateway, shard_id, initial=initial)


def build_client(config: DiscordConfig) -> discord.Client:
    # discord.py's REST base and default gateway are class-wide: one Discord per process.
    if config.api_url:
        discord.http.Route.BASE = config.api_url
    if config.gateway_url:
        # The plain client always dials DEFAULT_GATEWAY (and falls back to it when a
        # session is invalidated); it never asks the REST API where the gateway is.
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(config.gateway_url)
    options: dict[str, Any] = {
        "intents": intents(),
        # Joins arrive through the gateway anyway; fetching every member list at start-up
        # is slow in big servers and nothing here needs it.
        "chunk_guilds_at_startup": False,
        # The agent's text never pings anyone by accident; replies allow their one user.
        "allowed_mentions": discord.AllowedMentions.none(),
    }
    if not config.sharded:
        return discord.Client(**options)
    if config.shard_ids is None:
        client = ShardedClient(shard_count=config.shard_count, **options)
    else:
        client = ShardedClient(shard_count=config.shard_count, shard_ids=list(config.shard_ids), **options)
    client.gateway = yarl.URL(config.gateway_url) if config.gateway_url else None
    return client


# -- connecting, again and again while Discord cannot be reached ---------------------
CONNECT_RETRY_FIRST = 2.0  # seconds; doubling
CONNECT_RETRY_MAX = 300.0
# Failures that pass: the network, Discord's 5xx, a gateway that does not answer.
# A bad token (LoginFailure) or missing intents are not retried: they need a person.
PASSING_CONNECT_ERRORS = (
    OSError,
    aiohttp.ClientError,
    TimeoutError,
    discord.GatewayNotFound,
    discord.DiscordServerError,
    discord.ConnectionClosed,
)


async def run_client(
    client: discord.Client, token: str, closing: Callable[[], bool], first: float = CONNECT_RETRY_FIRST
) -> None:
    """Log in and run `client` until it is closed. While Discord's API cannot be
    reached at login, or its gateway before the first session, retry with backoff
    (2 s, doubling, up to 5 min), saying so each time, so that an outage at start
    does not stop the bot (other platforms keep running meanwhile); once a session
    exists, discord.py's own reconnect loop takes over. Raises discord.LoginFailure
    for a bad token and discord.PrivilegedIntentsRequired when the portal switches
    are off."""
    backoff = _Backoff(first, closing)
    async with client:
        while True:
            try:
                await client.login(token)
                break
            except PASSING_CONNECT_ERRORS as error:
                # A fresh session and connector for the next try (closing one closes both).
                await client.http.close()
                client.http.connector = discord.utils.MISSING
                if not await backoff.wait(f"cannot reach Discord ({_reason(error)})"):
                    return
        while not client.is_closed():
            try:
                await client.connect(reconnect=True)
                return
            except (*PASSING_CONNECT_ERRORS, AttributeError) as error:
                # Before its first session, discord.py's reconnect loop does not retry: it
                # reads the sequence of a websocket it never had ('NoneType' object has no
                # attribute 'sequence'). Once a session exists, its own retries hold.
                if client.ws is not None or client.is_closed():
                    raise
                if not await backoff.wait(f"cannot reach Discord's gateway ({_reason(error)})"):
                    return


class _Backoff:
    """Waits between connection attempts: `first` seconds, doubling, at most CONNECT_RETRY_MAX."""

    def __init__(self, first: float, closing: Callable[[], bool]) -> None:
        self.delay, self.closing = first, closing

    async def wait(self, why: str) -> bool:
        """Say why and wait; False once the adapter is closing (stop trying)."""
        if self.closing():
            return False
        log.warning("discord: %s; retrying in %.0f s", why, self.delay)
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, CONNECT_RETRY_MAX)
        return not self.closing()


def _reason(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


async def sync_commands(tree: app_commands.CommandTree[discord.Client], guild_id: int | None) -> None:
    """Publish the slash commands: to one server (instant) or globally."""
    try:
        if guild_id is not None:
            guild = discord.Object(id=guild_id)
            tree.copy_global_to(guild=guild)
            synced = await tree.sync(guild=guild)
            log.info("slash commands synced to server %s: %d", guild.id, len(synced))
        else:
            synced = await tree.sync()
            log.info("slash commands synced globally: %d (may take up to an hour to appear)", len(synced))
    except discord.HTTPException as error:
        log.warning("could not sync slash commands (%s); previously synced ones stay", error)


def log_ready(client: discord.Client, config: DiscordConfig) -> None:
    user = client.user
    log.info(
        "connected to Discord as %s (id %s) in %d servers, %s",
        user,
        user.id if user else "?",
        len(client.guilds),
        f"{client.shard_count} shards" if config.sharded else "1 shard",
    )
