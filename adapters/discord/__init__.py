"""Discord: gateway events in, the agent's replies out (adapters/discord/adapter.py tells how)."""

from adapters.discord.adapter import DiscordAdapter
from adapters.discord.client import intents
from adapters.discord.config import DEFAULT_MAX_UPLOAD_BYTES, DiscordConfig
from adapters.discord.parse import dm_address
from adapters.discord.send import nonce_of

__all__ = ["DEFAULT_MAX_UPLOAD_BYTES", "DiscordAdapter", "DiscordConfig", "dm_address", "intents", "nonce_of"]
