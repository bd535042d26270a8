"""Discord: gateway events in, the agent's replies out (adapters/discord/adapter.py tells how)."""

from collections.abc import Mapping

from adapters.discord.adapter import DiscordAdapter
from adapters.discord.client import intents
from adapters.discord.config import DEFAULT_MAX_UPLOAD_BYTES, DiscordConfig
from adapters.discord.parse import dm_address
from adapters.discord.send import nonce_of
from bot.ports import AdapterPort


def plan(bot: AdapterPort, env: Mapping[str, str]) -> tuple[DiscordAdapter | None, str]:
    """The adapter for `memgpt-bot run` (adapters/platforms.py), or None and why not."""
    config = DiscordConfig.from_env(env)
    if config is None:
        return None, "DISCORD_TOKEN is not set"
    sharding = f", sharded ({env.get('DISCORD_SHARD_COUNT')})" if env.get("DISCORD_SHARD_COUNT") else ""
    return DiscordAdapter(bot, config), f"gateway connection{sharding}"


__all__ = ["DEFAULT_MAX_UPLOAD_BYTES", "DiscordAdapter", "DiscordConfig", "dm_address", "intents", "nonce_of", "plan"]
