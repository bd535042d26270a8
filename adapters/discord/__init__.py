"""Discord: gateway events in, the agent's replies out (adapters/discord/adapter.py tells how)."""

from adapters.discord.adapter import SORRY, DiscordAdapter, DiscordConfig, dm_address, nonce_of

__all__ = ["SORRY", "DiscordAdapter", "DiscordConfig", "dm_address", "nonce_of"]
