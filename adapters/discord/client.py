"""The Discord connection: the discord.py client (plain or sharded) with only
the intents the adapter uses, logging in and running it, and publishing the
slash commands once logged in. What the events mean is the adapter's business
(adapters/discord/adapter.py), not this module's.
"""

from __future__ import annotations

import logging
from typing import Any

import discord
from discord import app_commands

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


def build_client(config: DiscordConfig) -> discord.Client:
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
        return discord.AutoShardedClient(shard_count=config.shard_count, **options)
    return discord.AutoShardedClient(shard_count=config.shard_count, shard_ids=list(config.shard_ids), **options)


async def run_client(client: discord.Client, token: str) -> None:
    """Log in and connect; returns once the client is closed. Raises discord.LoginFailure
    for a bad token and discord.PrivilegedIntentsRequired when the portal switches are off."""
    async with client:
        await client.start(token)


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
