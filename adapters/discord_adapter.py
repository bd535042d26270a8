"""The Discord adapter: gateway events in, the agent's replies out.

Like discord.py's own connection state, which turns each raw payload into a
typed model in one small `parse_<event>` method, each Discord event here has one
small function that builds a typed bot event (`user_message`, `file_uploaded`,
`user_joined`) and one handler that hands it to the bot and delivers the
replies (`on_message`, `on_member_join`). The adapter only ever calls the
bot's port (`handle`, `memory_report`, `forget_user`); it knows nothing of memory.

Who is answered: direct messages always; in servers, messages that mention the
bot, or any message in an always-on channel (and its threads). Other bots,
webhooks, system messages and the bot itself are never answered.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import discord
from discord import app_commands

from adapters.discord_commands import FORGET_TIMEOUT, MESSAGE_LIMIT, PLATFORM, add_commands
from adapters.splitting import split_message
from bot.config import ConfigError
from bot.events import Event, FileUploaded, Reply, UserJoined, UserMessage, agent_key
from bot.ports import READABLE_SUFFIXES, BotPort

log = logging.getLogger(__name__)

DEFAULT_MAX_UPLOAD_BYTES = 5 * 1024 * 1024
# What the bot can read, from its port. A text/* or application/pdf content type is accepted
# whatever the name.
UPLOAD_SUFFIXES = READABLE_SUFFIXES
SORRY = "Sorry, something went wrong on my side and I could not answer that. Please try again in a moment."


@dataclass(slots=True)
class DiscordConfig:
    token: str = field(repr=False)  # never in a log line or a traceback
    always_on_channels: frozenset[int] = frozenset()
    sharded: bool = False  # AutoShardedClient instead of a plain Client
    shard_count: int | None = None  # None with sharded: Discord's recommended count
    shard_ids: tuple[int, ...] | None = None  # the shards this process runs (several processes)
    command_guild_id: int | None = None  # sync slash commands to one server only (instant)
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DiscordConfig | None:
        """The Discord settings, or None when DISCORD_TOKEN is unset (Discord is off)."""
        token = env.get("DISCORD_TOKEN", "").strip()
        if not token:
            return None
        shards = env.get("DISCORD_SHARD_COUNT", "").strip().lower()
        shard_count = None if shards in ("", "auto") else _positive(shards, "DISCORD_SHARD_COUNT")
        shard_ids = tuple(_ids(env.get("DISCORD_SHARD_IDS", ""), "DISCORD_SHARD_IDS", allow_zero=True)) or None
        if shard_ids is not None:
            if shard_count is None:
                raise ConfigError("DISCORD_SHARD_IDS needs a numeric DISCORD_SHARD_COUNT (the total across processes)")
            if max(shard_ids) >= shard_count:
                raise ConfigError(f"DISCORD_SHARD_IDS must be below DISCORD_SHARD_COUNT ({shard_count})")
        guild = env.get("DISCORD_COMMAND_GUILD_ID", "").strip()
        upload = env.get("DISCORD_MAX_UPLOAD_BYTES", "").strip()
        return cls(
            token=token,
            always_on_channels=frozenset(_ids(env.get("DISCORD_ALWAYS_ON_CHANNELS", ""), "DISCORD_ALWAYS_ON_CHANNELS")),
            sharded=bool(shards),
            shard_count=shard_count,
            shard_ids=shard_ids,
            command_guild_id=_positive(guild, "DISCORD_COMMAND_GUILD_ID") if guild else None,
            max_upload_bytes=_positive(upload, "DISCORD_MAX_UPLOAD_BYTES") if upload else DEFAULT_MAX_UPLOAD_BYTES,
        )


def _positive(value: str, name: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise ConfigError(f"{name} must be a positive whole number, not {value!r}")
    return int(value)


def _ids(value: str, name: str, *, allow_zero: bool = False) -> list[int]:
    parts = [part.strip() for part in value.split(",") if part.strip()]
    bad = [part for part in parts if not part.isdigit() or (int(part) == 0 and not allow_zero)]
    if bad:
        raise ConfigError(f"{name} takes comma-separated numeric ids (Developer Mode → Copy ID), not {bad[0]!r}")
    return [int(part) for part in parts]


def dm_address(user_id: int, *, fallback_channel_id: int | None = None) -> dict[str, Any]:
    """A `reply_to` that sends to the user's DMs (for replies not answering a message, such as
    check-ins); `fallback_channel_id`, if set, is used, with a mention, when their DMs are closed."""
    return {"channel_id": None, "guild": False, "user_id": user_id, "fallback_channel_id": fallback_channel_id}


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


class _Lanes:
    """One first-in, first-out lane per user. The runtime already handles one user's events
    in arrival order, but that alone does not keep their replies in order: downloads and the
    typing indicator come before `handle`, and sending comes after it, so event N+1 could
    otherwise reach the runtime first, or send while N is still sending its chunks.
    Different users never share a lane."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._holders: dict[str, int] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        # No await before the lock's queue is joined, and asyncio.Lock wakes waiters in
        # order, so lanes are entered in the order discord.py dispatched the events.
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._holders[key] = self._holders.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._holders[key] -= 1
            if not self._holders[key]:  # keep no lock per user who ever wrote
                del self._holders[key], self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)


class DiscordAdapter:
    """Runs the bot on Discord: `await adapter.start()` until `await adapter.close()`."""

    def __init__(self, bot: BotPort, config: DiscordConfig, *, forget_timeout: float = FORGET_TIMEOUT) -> None:
        self.bot = bot
        self.config = config
        self.client = self._build_client()
        self.tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(self.client)
        add_commands(self.tree, bot, forget_timeout=forget_timeout)
        self.lanes = _Lanes()
        for handler in (self.on_ready, self.on_message, self.on_member_join):
            self.client.event(handler)
        self.client.setup_hook = self.sync_commands  # type: ignore[method-assign]

    def _build_client(self) -> discord.Client:
        options: dict[str, Any] = {
            "intents": intents(),
            # Joins arrive through the gateway anyway; fetching every member list at start-up
            # is slow in big servers and nothing here needs it.
            "chunk_guilds_at_startup": False,
            # The agent's text never pings anyone by accident; replies allow their one user.
            "allowed_mentions": discord.AllowedMentions.none(),
        }
        if not self.config.sharded:
            return discord.Client(**options)
        shard_ids = list(self.config.shard_ids) if self.config.shard_ids is not None else None
        return discord.AutoShardedClient(shard_count=self.config.shard_count, shard_ids=shard_ids, **options)

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Log in and connect; returns once the client is closed. Raises discord.LoginFailure
        for a bad token and discord.PrivilegedIntentsRequired when the portal switches are off."""
        async with self.client:
            await self.client.start(self.config.token)

    async def close(self) -> None:
        await self.client.close()

    async def sync_commands(self) -> None:
        """Publish /memory and /forget (runs once, after login)."""
        try:
            if self.config.command_guild_id is not None:
                guild = discord.Object(id=self.config.command_guild_id)
                self.tree.copy_global_to(guild=guild)
                synced = await self.tree.sync(guild=guild)
                log.info("slash commands synced to server %s: %d", guild.id, len(synced))
            else:
                synced = await self.tree.sync()
                log.info("slash commands synced globally: %d (may take up to an hour to appear)", len(synced))
        except discord.HTTPException as error:
            log.warning("could not sync slash commands (%s); previously synced ones stay", error)

    async def on_ready(self) -> None:
        user = self.client.user
        log.info("connected to Discord as %s (id %s) in %d servers, %s", user, user.id if user else "?",
                 len(self.client.guilds), f"{self.client.shard_count} shards" if self.config.sharded else "1 shard")

    # -- platform events -> typed events ---------------------------------------
    def addressed_text(self, message: discord.Message) -> str | None:
        """The text meant for the bot, or None if the message is not for it."""
        me = self.client.user
        author = message.author
        if me is None or author.bot or author.id == me.id or message.webhook_id is not None or message.is_system():
            return None
        guild = message.guild
        role = guild.self_role if guild is not None else None
        mentioned = any(user.id == me.id for user in message.mentions) or (
            role is not None and role in message.role_mentions)
        if guild is not None and not (mentioned or self._always_on(message.channel)):
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

    def _always_on(self, channel: discord.abc.Messageable) -> bool:
        # A thread inherits its parent channel's setting.
        ids = self.config.always_on_channels
        return getattr(channel, "id", None) in ids or getattr(channel, "parent_id", None) in ids

    @staticmethod
    def reply_to(message: discord.Message) -> dict[str, Any]:
        return {"channel_id": message.channel.id, "guild": message.guild is not None, "user_id": message.author.id}

    def user_message(self, message: discord.Message, text: str) -> UserMessage:
        return UserMessage(
            platform=PLATFORM,
            user_id=str(message.author.id),
            text=text,
            display_name=message.author.display_name,
            channel=_place(message.channel),
            created_at=message.created_at,
            event_id=str(message.id),
            reply_to=self.reply_to(message),
        )

    def file_uploaded(self, message: discord.Message, attachment: discord.Attachment, data: bytes) -> FileUploaded:
        return FileUploaded(
            platform=PLATFORM,
            user_id=str(message.author.id),
            filename=attachment.filename,
            data=data,
            content_type=_media_type(attachment),
            display_name=message.author.display_name,
            created_at=message.created_at,
            event_id=f"{message.id}:{attachment.id}",
            reply_to=self.reply_to(message),
        )

    @staticmethod
    def user_joined(member: discord.Member) -> UserJoined:
        system = member.guild.system_channel
        return UserJoined(
            platform=PLATFORM,
            user_id=str(member.id),
            display_name=member.display_name,
            place=f"the {member.guild.name} server",
            created_at=member.joined_at or discord.utils.utcnow(),
            reply_to=dm_address(member.id, fallback_channel_id=system.id if system else None),
        )

    def refusal(self, attachment: discord.Attachment) -> str | None:
        """Why this attachment will not be read, or None if it will."""
        name = attachment.filename
        media_type = _media_type(attachment)
        readable = PurePath(name).suffix.lower() in UPLOAD_SUFFIXES or media_type.startswith("text/") or (
            media_type == "application/pdf")
        if not readable:
            return f"I can't read {name}: I only take text, Markdown, HTML or PDF files."
        if attachment.size > self.config.max_upload_bytes:
            return (f"I can't take {name}: it is {_size(attachment.size)} and my limit is "
                    f"{_size(self.config.max_upload_bytes)}.")
        return None

    # -- handlers: hand the event to the bot, deliver the replies ----------------
    async def on_message(self, message: discord.Message) -> None:
        text = self.addressed_text(message)
        if text is None:
            return
        # Entered before any await: see _Lanes.
        async with self.lanes.hold(agent_key(PLATFORM, str(message.author.id))):
            channel = message.channel
            # Files first, so the agent has read them by the time it answers the text.
            for attachment in message.attachments:
                replies = await self._upload(message, attachment)
                await self.deliver(replies, channel=channel)
            if text:
                await self.deliver(await self._handle(self.user_message(message, text), channel), channel=channel)

    async def on_member_join(self, member: discord.Member) -> None:
        if member.bot:
            return
        event = self.user_joined(member)
        async with self.lanes.hold(event.agent_key):
            # A greeting goes to the newcomer's DMs (delivery falls back to the system channel).
            await self.deliver(await self._handle(event, None), channel=member)

    async def run_event(self, event: Event) -> None:
        """Handle an event that did not come from Discord (a scheduled check-in, say) and deliver
        its replies where `event.reply_to` says, in the user's lane like their messages."""
        async with self.lanes.hold(event.agent_key):
            await self.deliver(await self._handle(event, None))

    async def _upload(self, message: discord.Message, attachment: discord.Attachment) -> list[Reply]:
        reason = self.refusal(attachment)
        if reason is None:
            try:
                data = await attachment.read()
            except discord.HTTPException as error:
                log.warning("could not download attachment %s of message %s: %s", attachment.id, message.id, error)
                reason = f"I couldn't download {attachment.filename}; please try again."
            else:
                return await self._handle(self.file_uploaded(message, attachment, data), message.channel)
        return [Reply(text=reason, platform=PLATFORM, user_id=str(message.author.id),
                      reply_to=self.reply_to(message), event_id=f"{message.id}:{attachment.id}")]

    async def _handle(self, event: Event, channel: discord.abc.Messageable | None) -> list[Reply]:
        async with _typing(channel):
            try:
                return await self.bot.handle(event)
            except Exception:
                log.exception("handling %s %s of Discord user %s failed", event.kind, event.event_id, event.user_id)
                return [Reply(text=SORRY, platform=PLATFORM, user_id=event.user_id, reply_to=event.reply_to,
                              event_id=event.event_id)]

    # -- delivery --------------------------------------------------------------
    async def wait_ready(self) -> None:
        """Return once the gateway session is ready, so deliveries can go out."""
        await self.client.wait_until_ready()

    async def deliver(self, replies: Sequence[Reply], *, channel: discord.abc.Messageable | None = None) -> None:
        """Send replies in order to `channel`, or where each reply's `reply_to` says (a channel id,
        else the user's DMs, else `fallback_channel_id` when their DMs are closed). A failure is
        logged and ends this delivery, so no later part arrives without an earlier one."""
        for reply in replies:
            if not reply.text.strip():
                continue
            where = reply.reply_to
            user_id = int(where["user_id"])
            try:
                target = channel or await self._target(where)
                await self._post(target, reply.text, mention=user_id if where.get("guild") else None)
            except discord.Forbidden as error:
                fallback = self._fallback(where)
                if fallback is None or not await self._try_post(fallback, reply, error):
                    self._log_failure(reply, error)
                    return
            except discord.HTTPException as error:
                self._log_failure(reply, error)
                return

    async def _try_post(self, channel: discord.abc.Messageable, reply: Reply, first: discord.HTTPException) -> bool:
        log.info("could not reach Discord user %s directly (%s); using channel %s", reply.user_id, first,
                 getattr(channel, "id", "?"))
        try:
            await self._post(channel, reply.text, mention=int(reply.reply_to["user_id"]))
        except discord.HTTPException as error:
            self._log_failure(reply, error)
            return False
        return True

    @staticmethod
    async def _post(channel: discord.abc.Messageable, text: str, *, mention: int | None) -> None:
        """One reply as messages under the limit; in shared channels the first pings its user."""
        prefix = f"<@{mention}> " if mention is not None else ""
        allowed = discord.AllowedMentions(everyone=False, roles=False, users=[discord.Object(id=mention)]) if (
            mention is not None) else discord.AllowedMentions.none()
        for index, chunk in enumerate(split_message(text, MESSAGE_LIMIT - len(prefix))):
            await channel.send(prefix + chunk if index == 0 else chunk, allowed_mentions=allowed)

    async def _target(self, where: Mapping[str, Any]) -> discord.abc.Messageable:
        channel_id = where.get("channel_id")
        if channel_id:
            channel = self.client.get_channel(int(channel_id))
            if isinstance(channel, discord.abc.Messageable):
                return channel
            return self.client.get_partial_messageable(int(channel_id))
        user_id = int(where["user_id"])
        return self.client.get_user(user_id) or await self.client.fetch_user(user_id)

    def _fallback(self, where: Mapping[str, Any]) -> discord.abc.Messageable | None:
        channel_id = where.get("fallback_channel_id")
        if not channel_id:
            return None
        channel = self.client.get_channel(int(channel_id))
        return channel if isinstance(channel, discord.abc.Messageable) else None

    @staticmethod
    def _log_failure(reply: Reply, error: discord.HTTPException) -> None:
        log.warning("could not send a reply to Discord user %s (event %s, channel %s): %s %s", reply.user_id,
                    reply.event_id, reply.reply_to.get("channel_id") or "DM", error.status, error.text or error)


@asynccontextmanager
async def _typing(channel: discord.abc.Messageable | None) -> AsyncIterator[None]:
    """Show "typing…" in `channel` while the body runs (discord.py renews it every few seconds)."""
    async with AsyncExitStack() as stack:
        if channel is not None:
            try:  # a nicety: lacking the permission to type must not stop the answer
                await stack.enter_async_context(channel.typing())
            except discord.HTTPException as error:
                log.info("no typing indicator in channel %s: %s", getattr(channel, "id", "?"), error)
        yield


def _place(channel: discord.abc.Messageable) -> str:
    if isinstance(channel, discord.abc.GuildChannel | discord.Thread):
        return f"#{channel.name} in {channel.guild.name}"
    return "DM"


def _media_type(attachment: discord.Attachment) -> str:
    return (attachment.content_type or "").split(";")[0].strip().lower()


def _size(size: int) -> str:
    if size >= 100 * 1024:
        return f"{size / (1024 * 1024):.1f} MB"
    return f"{max(1, round(size / 1024))} KB"
