"""Discord's side of listening channels (bot/channels/port.py): a server
message's mode, the lines heard in `listen` and `open` channels handed to the
bot (a gateway replay keeps a line once: keeping is idempotent by the
message's snowflake), MESSAGE_UPDATE / MESSAGE_DELETE applied to what was kept
(discord.py's raw events: the message need not be in its cache), and who may
change a channel's mode with /channel (the Manage Channels permission).

A channel is keyed by its guild and its id. A thread is its channel's: the
parent's mode, and its lines in the parent's memory; a private thread, a
private place of its own (adapters/discord/parse.py place_of), follows its
parent's mode but keeps its lines apart. A DM never comes here.
"""

from __future__ import annotations

from dataclasses import replace

import discord

from adapters.channels import default_mode
from adapters.discord.config import PLATFORM, DiscordConfig
from adapters.discord.parse import channel_line, place_of
from bot.channels.port import ChannelPort, ChannelRef, Heard, Mode
from bot.events import Place


class DiscordListening:
    """What the Discord adapter asks and tells the bot about a channel's memory."""

    def __init__(self, bot: ChannelPort, config: DiscordConfig, client: discord.Client) -> None:
        self.bot = bot
        self.config = config
        self.client = client

    def channel_of(self, channel: discord.abc.Messageable, guild_id: int) -> ChannelRef:
        """Where lines said in `channel` are kept (a thread: its channel's, but a private one's own)."""
        return ChannelRef(PLATFORM, str(guild_id), replace(place_of(channel), thread=""))

    def mode_ref(self, channel: discord.abc.Messageable, guild_id: int) -> tuple[ChannelRef, Mode]:
        """The channel whose mode applies in `channel` (a thread: its parent), and its default."""
        parent = channel.parent_id if isinstance(channel, discord.Thread) else None
        own = getattr(channel, "id", None)
        ref = ChannelRef(PLATFORM, str(guild_id), Place("private", str(parent or own)))
        return ref, default_mode(self.config.always_on_channels, self.config.listen_channels, own, parent)

    async def mode(self, channel: discord.abc.Messageable, guild_id: int) -> Mode:
        ref, default = self.mode_ref(channel, guild_id)
        return await self.bot.channel_mode(ref, default)

    async def hear(self, message: discord.Message) -> tuple[Mode, str]:
        """A person's message in a server: its mode, and, in `listen` and `open`, the line
        handed to the bot with the notice to post there ("" but the first time)."""
        assert message.guild is not None
        mode = await self.mode(message.channel, message.guild.id)
        line = channel_line(message, self.client.user)
        if mode == "mention" or line is None:
            return mode, ""
        heard = Heard(
            channel=self.channel_of(message.channel, message.guild.id),
            message_id=str(message.id),
            user_id=str(message.author.id),
            speaker_name=line.author,
            text=line.text,
            said_at=message.created_at,
        )
        return mode, await self.bot.hear(heard)

    async def edited(self, payload: discord.RawMessageUpdateEvent) -> None:
        message = payload.message
        if payload.guild_id is None or "content" not in payload.data:  # a DM, or an embed filled in
            return
        line = channel_line(message, self.client.user)
        edited_at = message.edited_at or discord.utils.utcnow()
        channel = self.channel_of(self._channel(payload.channel_id, message.channel), payload.guild_id)
        if line is None:  # emptied: nothing is left of the line
            await self.bot.heard_delete(channel, str(payload.message_id))
            return
        await self.bot.heard_edit(channel, str(payload.message_id), line.text, edited_at)

    async def deleted(self, guild_id: int | None, channel_id: int, message_ids: set[int]) -> None:
        if guild_id is None:
            return
        channel = self.channel_of(self._channel(channel_id), guild_id)
        for message_id in sorted(message_ids):
            await self.bot.heard_delete(channel, str(message_id))

    def _channel(self, channel_id: int, fallback: discord.abc.Messageable | None = None) -> discord.abc.Messageable:
        """The channel from discord.py's cache (a thread knows its parent); else what is known of it."""
        cached = self.client.get_channel(channel_id)
        if isinstance(cached, discord.abc.Messageable):
            return cached
        return fallback or self.client.get_partial_messageable(channel_id)

    @staticmethod
    def manages(interaction: discord.Interaction) -> bool:
        """Whether who typed the command may change the channel's mode: Manage Channels there."""
        return bool(interaction.guild_id) and interaction.permissions.manage_channels
