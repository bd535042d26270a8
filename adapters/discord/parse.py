"""Discord's models into typed bot events, without any I/O.

discord.py's connection state has already turned the raw gateway payload into
a `discord.Message` or `discord.Member` (its `parse_message_create`,
`parse_guild_member_add`); here each of those becomes the bot's own event, one
small function each: `parse_message` (a DM, a mention, a message in an
always-on channel), `parse_attachment` (a file shared with the bot) and
`parse_member_join`. `addressed_text` says whether a message is for the bot at
all, and `message_payload` / `join_payload` are what the inbox keeps to
build the event again after a crash.

Who is answered: direct messages always; in servers, messages that mention the
bot, or any message in an `open` channel (and its threads: the mode is the
adapter's to find, adapters/discord/listening.py). Other bots, webhooks,
system messages and the bot itself are never answered, nor kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import discord

from adapters.discord.config import PLATFORM
from bot.events import ChannelLine, FileUploaded, Place, PlaceKind, UserJoined, UserMessage
from bot.ports import readable


def from_a_person(message: discord.Message, me: discord.abc.User | None) -> bool:
    """Written by a person: not a bot (the bot itself included), a webhook or the system."""
    author = message.author
    return not (me is None or author.bot or author.id == me.id or message.webhook_id is not None or message.is_system())


def addressed_text(message: discord.Message, me: discord.ClientUser | None, open_here: bool = False) -> str | None:
    """The text meant for the bot, or None if the message is not for it (`open_here`:
    the message is in an open channel, where every message is)."""
    if me is None or not from_a_person(message, me):
        return None
    guild = message.guild
    role = guild.self_role if guild is not None else None
    mentioned = any(user.id == me.id for user in message.mentions) or (
        role is not None and role in message.role_mentions
    )
    if guild is not None and not (mentioned or open_here):
        return None
    text = re.sub(rf"<@!?{me.id}>[ \t]?", "", message.content)
    if role is not None:
        text = text.replace(f"<@&{role.id}>", "")
    for user in message.mentions:  # other people's mentions become names the model can read
        text = re.sub(rf"<@!?{user.id}>", f"@{user.display_name}", text)
    text = text.strip()
    if not text and mentioned and not message.attachments:  # a bare ping still deserves an answer
        text = f"@{((guild.me if guild else None) or me).display_name}"
    return text


def place_of(channel: discord.abc.Messageable) -> Place:
    """Where a message was posted, from discord.py's cached models (no I/O). A guild
    channel is public when @everyone may view it, private otherwise; a thread has
    its parent channel's kind and id, except a private thread, a private place of
    its own whatever its parent; a group DM is private; a DM is the person's DM."""
    if isinstance(channel, discord.Thread):
        parent, thread = channel.parent, str(channel.id)
        if channel.type is discord.ChannelType.private_thread:
            # Its own conversation: its members are not the parent's, nor another private thread's.
            return Place("private", thread, f"#{channel.name}", thread=thread)
        kind: PlaceKind = _visibility(parent) if parent is not None else "private"  # not cached: the safe side
        name = f"#{parent.name}" if parent is not None else f"#{channel.name}"
        return Place(kind, str(channel.parent_id), name, thread=thread)
    if isinstance(channel, discord.abc.GuildChannel):
        return Place(_visibility(channel), str(channel.id), f"#{channel.name}")
    if isinstance(channel, discord.GroupChannel):
        return Place("private", str(channel.id), channel.name or "a group DM")
    if isinstance(channel, discord.PartialMessageable) and channel.guild is not None:
        return Place("private", str(channel.id), f"channel {channel.id}")  # not cached: the safe side
    return Place()


def _visibility(channel: discord.abc.GuildChannel) -> PlaceKind:
    everyone = channel.guild.default_role
    return "public" if channel.permissions_for(everyone).view_channel else "private"


def place_json(place: Place) -> dict[str, str]:
    return {"key": place.key, "name": place.name, "thread": place.thread}


def place_from_json(data: Mapping[str, Any] | None) -> Place | None:
    """A recorded place (None for entries recorded before places existed)."""
    if not data or not data.get("key"):
        return None
    return replace(Place.from_key(str(data["key"]), str(data.get("name") or "")), thread=str(data.get("thread") or ""))


def channel_line(message: discord.Message, me: discord.abc.User | None) -> ChannelLine | None:
    """One earlier message of the channel, as context; None for what nobody said."""
    if message.is_system():
        return None
    text = message.clean_content.strip()
    files = ", ".join(attachment.filename for attachment in message.attachments)
    if files:
        text = f"{text} [shared {files}]".strip()
    if not text:
        return None
    own = me is not None and message.author.id == me.id
    author = message.author
    return ChannelLine(author.display_name, text, message.created_at, from_bot=own, author_id=str(author.id))


def reply_to(message: discord.Message) -> dict[str, Any]:
    return {"channel_id": message.channel.id, "guild": message.guild is not None, "user_id": message.author.id}


def dm_address(user_id: int, *, fallback_channel_id: int | None = None) -> dict[str, Any]:
    """A `reply_to` that sends to the user's DMs (for replies not answering a message, such as
    check-ins); `fallback_channel_id`, if set, is used, with a mention, when their DMs are closed."""
    return {"channel_id": None, "guild": False, "user_id": user_id, "fallback_channel_id": fallback_channel_id}


def parse_message(
    message: discord.Message,
    text: str,
    *,
    in_inbox: bool = False,
    place: Place | None = None,
    context: list[ChannelLine] | None = None,
) -> UserMessage:
    return UserMessage(
        platform=PLATFORM,
        user_id=str(message.author.id),
        text=text,
        display_name=message.author.display_name,
        channel=_place(message.channel),
        workspace=str(message.guild.id) if message.guild else "",
        created_at=message.created_at,
        event_id=str(message.id),
        reply_to=reply_to(message),
        dm_reply_to=dm_address(message.author.id),  # no fallback: never a channel
        in_inbox=in_inbox,
        place=place or place_of(message.channel),
        channel_context=context or [],
    )


def parse_attachment(
    message: discord.Message,
    attachment: discord.Attachment,
    data: bytes,
    *,
    in_inbox: bool = False,
    place: Place | None = None,
) -> FileUploaded:
    return FileUploaded(
        platform=PLATFORM,
        user_id=str(message.author.id),
        filename=attachment.filename,
        data=data,
        content_type=media_type(attachment),
        display_name=message.author.display_name,
        created_at=message.created_at,
        event_id=f"{message.id}:{attachment.id}",
        inbox_id=str(message.id),
        reply_to=reply_to(message),
        dm_reply_to=dm_address(message.author.id),  # no fallback: never a channel
        in_inbox=in_inbox,
        place=place or place_of(message.channel),
    )


def parse_member_join(payload: Mapping[str, Any]) -> UserJoined:
    """A join, from its `join_payload` (fresh or read back from the inbox)."""
    system = payload.get("system_channel_id")
    return UserJoined(
        platform=PLATFORM,
        user_id=str(payload["user_id"]),
        display_name=str(payload["display_name"]),
        joined=f"the {payload['guild_name']} server",
        created_at=datetime.fromisoformat(str(payload["joined_at"])),
        event_id=str(payload["event_id"]),
        reply_to=dm_address(int(payload["user_id"]), fallback_channel_id=int(system) if system else None),
    )


def join_payload(member: discord.Member) -> dict[str, Any]:
    """All a join's event needs, as plain JSON: a replay rebuilds it without asking Discord."""
    system = member.guild.system_channel
    joined_at = member.joined_at or discord.utils.utcnow()
    return {
        "kind": "join",
        # Discord gives a join no id of its own; this one is the same however often it is built.
        "event_id": f"join:{member.guild.id}:{member.id}:{int(joined_at.timestamp())}",
        "user_id": str(member.id),
        "display_name": member.display_name,
        "guild_name": member.guild.name,
        "system_channel_id": str(system.id) if system else None,
        "joined_at": joined_at.isoformat(),
    }


def message_payload(message: discord.Message) -> dict[str, Any]:
    """Where to fetch the message again (ids as strings: snowflakes exceed some JSON readers)."""
    return {
        "kind": "message",
        "event_id": str(message.id),
        "user_id": str(message.author.id),  # the lane a replay joins before fetching
        "channel_id": str(message.channel.id),
        "guild_id": str(message.guild.id) if message.guild else None,
        "message_id": str(message.id),
        # Where it was said, as it is now: a replay keeps it even if the channel changes.
        "place": place_json(place_of(message.channel)),
    }


def refusal(attachment: discord.Attachment, max_upload_bytes: int) -> str | None:
    """Why this attachment will not be read, or None if it will."""
    name = attachment.filename
    if not readable(name, media_type(attachment)):
        return f"I can't read {name}: I only take text, Markdown, HTML or PDF files."
    if attachment.size > max_upload_bytes:
        return f"I can't take {name}: it is {_size(attachment.size)} and my limit is {_size(max_upload_bytes)}."
    return None


def _place(channel: discord.abc.Messageable) -> str:
    if isinstance(channel, discord.abc.GuildChannel | discord.Thread):
        return f"#{channel.name} in {channel.guild.name}"
    if isinstance(channel, discord.PartialMessageable) and channel.guild is not None:
        return f"a channel in {channel.guild.name}"  # refetched after a restart, not in the cache
    return "DM"


def media_type(attachment: discord.Attachment) -> str:
    return (attachment.content_type or "").split(";")[0].strip().lower()


def _size(size: int) -> str:
    if size >= 100 * 1024:
        return f"{size / (1024 * 1024):.1f} MB"
    return f"{max(1, round(size / 1024))} KB"
