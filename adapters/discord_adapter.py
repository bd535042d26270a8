"""The Discord adapter: gateway events in, the agent's replies out.

Like discord.py's own connection state, which turns each raw payload into a
typed model in one small `parse_<event>` method, each Discord event here has one
small function that builds a typed bot event (`user_message`, `file_uploaded`,
`user_joined`) and one handler that hands it to the bot and delivers the
replies (`on_message`, `on_member_join`). The adapter only ever calls the
bot's port (`handle`, `memory_report`, `forget_user`, and the journal calls
below); it knows nothing of memory.

Who is answered: direct messages always; in servers, messages that mention the
bot, or any message in an always-on channel (and its threads). Other bots,
webhooks, system messages and the bot itself are never answered.

Crash safety (bot/durable/__init__.py tells the protocol). Discord neither waits for an
acknowledgement nor delivers a gateway event again, so here the journal is for
redoing work a crash cut short. With a bot that keeps one (the runtime), each
message meant for the bot and each join is recorded (`receive`) before any
work, with what rebuilds it: a message by channel and message id (fetched again
at replay, its files downloaded again; a message deleted meanwhile is skipped),
a join by the few fields its event needs (no fetch). `recover()` replays the
unfinished ones at start, in arrival order, through the same per-user lanes.
An event is `finished` once each of its replies was sent or handed to the
retrier. Bots without a journal (simple test bots) work as before.

Delivery outcomes, per reply with an outbox entry (`report_delivery`): sent;
RETRY for 429, 5xx and network errors; UNDELIVERABLE when the person cannot be
reached (50007: DMs closed, the bot blocked, no shared server; with no fallback
channel), the channel or user is unknown (404), or Discord refuses the message
(any other 4xx). While a reply to a person waits for a retry, their later
replies are not tried but held behind it (reported RETRY) (bot/durable/lanes.py, the same
order as on Slack), so the retrier sends them after the failed one, in order;
other people's replies still go.

Resending without duplicates. Every part of a reply with an outbox entry is
sent with a nonce derived from its outbox id and part number (a 25-character
digest: Discord's limit), and discord.py (2.7, `http.handle_message_parameters`)
sends `enforce_nonce: true` with every nonce: for a few minutes Discord answers
a repeated part with the message it already created instead of a new one. That
covers discord.py's own retries and the outbox retrier's quick ones. A crash
can outlast the window, and messages read back from history need not carry
their nonce, so a reply marked `resend` is first looked for among the channel's
last 50 messages: the bot's messages newer than the answered message that match
its parts in order (by nonce where one is given, else by content) are not sent
again. Limit: two replies to one event with the very same text may be taken for
one another when matched by content; beyond 50 newer messages a part is sent
again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any

import discord
from discord import app_commands

from adapters.discord_commands import FORGET_TIMEOUT, MESSAGE_LIMIT, PLATFORM, add_commands
from adapters.discord_support import (
    CALL_ERRORS,
    DEFAULT_MAX_UPLOAD_BYTES,
    DiscordConfig,
    describe_error,
    dm_address,
    intents,
    nonce_of,
    outcome_of,
    snowflake_of,
)
from adapters.splitting import split_message
from bot.durable.lanes import Lanes
from bot.events import Delivery, Event, FileUploaded, Redo, Reply, UserJoined, UserMessage, agent_key
from bot.ports import BotPort, readable

log = logging.getLogger(__name__)

SORRY = "Sorry, something went wrong on my side and I could not answer that. Please try again in a moment."
HISTORY_LIMIT = 50  # recent messages searched for a reply's parts before it is sent again


class DiscordAdapter:
    """Runs the bot on Discord: `await adapter.start()` until `await adapter.close()`."""

    def __init__(self, bot: BotPort, config: DiscordConfig, *, forget_timeout: float = FORGET_TIMEOUT) -> None:
        self.bot = bot
        self.config = config
        self.client = self._build_client()
        self.tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(self.client)
        add_commands(self.tree, bot, forget_timeout=forget_timeout)
        # One first-in, first-out lane per user (bot/durable/lanes.py). The runtime already
        # handles one user's events in arrival order, but that alone does not keep their replies
        # in order: downloads and the typing indicator come before `handle`, and sending comes
        # after it, so event N+1 could otherwise reach the runtime first, or send while N is
        # still sending its chunks.
        self.lanes = Lanes()
        # A bot with a journal (the runtime) records events and reports deliveries, so a
        # crash loses nothing (bot/durable/journal.py); simpler bots (tests) are served without.
        self._durable = callable(getattr(bot, "receive", None))
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
        if self.config.shard_ids is None:
            return discord.AutoShardedClient(shard_count=self.config.shard_count, **options)
        return discord.AutoShardedClient(
            shard_count=self.config.shard_count, shard_ids=list(self.config.shard_ids), **options
        )

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
        log.info(
            "connected to Discord as %s (id %s) in %d servers, %s",
            user,
            user.id if user else "?",
            len(self.client.guilds),
            f"{self.client.shard_count} shards" if self.config.sharded else "1 shard",
        )

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
            role is not None and role in message.role_mentions
        )
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

    def user_message(self, message: discord.Message, text: str, *, durable: bool = False) -> UserMessage:
        return UserMessage(
            platform=PLATFORM,
            user_id=str(message.author.id),
            text=text,
            display_name=message.author.display_name,
            channel=_place(message.channel),
            created_at=message.created_at,
            event_id=str(message.id),
            reply_to=self.reply_to(message),
            durable=durable,
        )

    def file_uploaded(
        self, message: discord.Message, attachment: discord.Attachment, data: bytes, *, durable: bool = False
    ) -> FileUploaded:
        return FileUploaded(
            platform=PLATFORM,
            user_id=str(message.author.id),
            filename=attachment.filename,
            data=data,
            content_type=_media_type(attachment),
            display_name=message.author.display_name,
            created_at=message.created_at,
            event_id=f"{message.id}:{attachment.id}",
            journal_id=str(message.id),
            reply_to=self.reply_to(message),
            durable=durable,
        )

    @staticmethod
    def user_joined(member: discord.Member) -> UserJoined:
        return DiscordAdapter.joined(DiscordAdapter.join_payload(member))

    @staticmethod
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

    @staticmethod
    def joined(payload: Mapping[str, Any]) -> UserJoined:
        system = payload.get("system_channel_id")
        return UserJoined(
            platform=PLATFORM,
            user_id=str(payload["user_id"]),
            display_name=str(payload["display_name"]),
            place=f"the {payload['guild_name']} server",
            created_at=datetime.fromisoformat(str(payload["joined_at"])),
            event_id=str(payload["event_id"]),
            reply_to=dm_address(int(payload["user_id"]), fallback_channel_id=int(system) if system else None),
        )

    @staticmethod
    def message_payload(message: discord.Message) -> dict[str, Any]:
        """Where to fetch the message again (ids as strings: snowflakes exceed some JSON readers)."""
        return {
            "kind": "message",
            "event_id": str(message.id),
            "user_id": str(message.author.id),  # the lane a replay joins before fetching
            "channel_id": str(message.channel.id),
            "guild_id": str(message.guild.id) if message.guild else None,
            "message_id": str(message.id),
        }

    def refusal(self, attachment: discord.Attachment) -> str | None:
        """Why this attachment will not be read, or None if it will."""
        name = attachment.filename
        if not readable(name, _media_type(attachment)):
            return f"I can't read {name}: I only take text, Markdown, HTML or PDF files."
        if attachment.size > self.config.max_upload_bytes:
            return (
                f"I can't take {name}: it is {_size(attachment.size)} and my limit is "
                f"{_size(self.config.max_upload_bytes)}."
            )
        return None

    # -- handlers: record the event, hand it to the bot, deliver the replies -------
    async def on_message(self, message: discord.Message) -> None:
        text = self.addressed_text(message)
        if text is None:
            return
        # Entered before any await: see self.lanes.
        async with self.lanes.hold(agent_key(PLATFORM, str(message.author.id))):
            durable = await self._record(self.message_payload(message))
            if durable is not None:
                await self._answer(message, text, durable=durable)

    async def on_member_join(self, member: discord.Member) -> None:
        if member.bot:
            return
        payload = self.join_payload(member)
        event = self.joined(payload)
        async with self.lanes.hold(event.agent_key):
            durable = await self._record(payload)
            if durable is not None:
                event.durable = durable
                await self._greet(event, member)

    async def _record(self, payload: dict[str, Any]) -> bool | None:
        """Record an event in the bot's journal before any work on it. True: recorded (a
        crash from here on is redone at restart); False: the bot keeps no journal, or it
        could not be written (the event is handled all the same, without that safety
        net); None: already recorded (Discord dispatched it twice), so it is dropped."""
        if not self._durable:
            return False
        event_id = str(payload["event_id"])
        try:
            if not await self.bot.receive(PLATFORM, event_id, str(payload["user_id"]), payload):
                log.info("Discord event %s was already received; ignoring the repeat", event_id)
                return None
        except Exception as error:  # the store is down: answering beats staying silent
            log.warning("could not record Discord event %s (%s); handling it without crash recovery", event_id, error)
            return False
        return True

    async def _answer(self, message: discord.Message, text: str, *, durable: bool) -> None:
        channel = message.channel
        # Files first, so the agent has read them by the time it answers the text.
        for attachment in message.attachments:
            await self.deliver(await self._upload(message, attachment, durable=durable), channel=channel)
        if text:
            event = self.user_message(message, text, durable=durable)
            await self.deliver(await self._handle(event, channel), channel=channel)
        # Not reached when a crash (or a bug) stops the work: then it stays pending and is redone.
        if durable:
            await self.bot.finished(str(message.id))

    async def _greet(self, event: UserJoined, channel: discord.abc.Messageable | None) -> None:
        # A greeting goes to the newcomer's DMs (delivery falls back to the system channel).
        await self.deliver(await self._handle(event, None), channel=channel)
        if event.durable:
            await self.bot.finished(event.event_id)

    async def run_event(self, event: Event) -> None:
        """Handle an event that did not come from Discord (a scheduled check-in, say) and deliver
        its replies where `event.reply_to` says, in the user's lane like their messages."""
        async with self.lanes.hold(event.agent_key):
            await self.deliver(await self._handle(event, None))

    async def _upload(
        self, message: discord.Message, attachment: discord.Attachment, *, durable: bool = False
    ) -> list[Reply]:
        reason = self.refusal(attachment)
        if reason is None:
            try:
                data = await attachment.read()
            except CALL_ERRORS as error:
                log.warning("could not download attachment %s of message %s: %s", attachment.id, message.id, error)
                reason = f"I couldn't download {attachment.filename}; please try again."
            else:
                event = self.file_uploaded(message, attachment, data, durable=durable)
                return await self._handle(event, message.channel)
        return [
            Reply(reason, PLATFORM, str(message.author.id), self.reply_to(message), f"{message.id}:{attachment.id}")
        ]

    async def _handle(self, event: Event, channel: discord.abc.Messageable | None) -> list[Reply]:
        async with _typing(channel):
            try:
                return await self.bot.handle(event)
            except Exception:
                log.exception("handling %s %s of Discord user %s failed", event.kind, event.event_id, event.user_id)
                return [event.reply(SORRY)]

    # -- crash recovery ----------------------------------------------------------
    async def recover(self) -> int:
        """Replay the events a crash left unfinished, in arrival order, and wait for them; the
        number replayed. Call once connected (cli/app.py does), before check-ins start."""
        if not self._durable:
            return 0
        return await self.replay(await self.bot.pending_events(PLATFORM))

    async def replay(self, redos: Sequence[Redo]) -> int:
        """Handle recorded events again, in order, and wait for them; how many."""
        # One task per event, created in arrival order: each joins its user's lane before its
        # first await, so one user's events are redone in order while different users' overlap.
        tasks = [asyncio.create_task(self._replay(redo), name=f"discord-replay-{redo.event_id}") for redo in redos]
        for redo, outcome in zip(redos, await asyncio.gather(*tasks, return_exceptions=True), strict=True):
            if isinstance(outcome, Exception):
                # Left unfinished: the next start tries it again (bot/durable/inbox.py caps the restarts).
                log.error("replaying Discord event %s failed", redo.event_id, exc_info=outcome)
        return len(redos)

    async def _replay(self, redo: Redo) -> None:
        payload, event_id = redo.payload, redo.event_id
        kind = payload.get("kind")
        if redo.notice:  # given up: the person is told, instead of a redo
            async with self.lanes.hold(agent_key(PLATFORM, str(payload["user_id"]))):
                if kind == "message":  # only someone who wrote waits for an answer
                    where = {
                        "channel_id": int(payload["channel_id"]),
                        "guild": payload.get("guild_id") is not None,
                        "user_id": int(payload["user_id"]),
                    }
                    await self.deliver([Reply(redo.notice, PLATFORM, str(payload["user_id"]), where, event_id)])
                await self.bot.finished(event_id)
            return
        if kind == "join":
            event = self.joined(payload)
            event.durable = True
            async with self.lanes.hold(event.agent_key):
                await self._greet(event, None)  # to reply_to: the DM, else the system channel
            return
        if kind != "message":
            log.error("cannot replay Discord event %s of unknown kind %r; dropping it", event_id, kind)
            await self.bot.finished(event_id)
            return
        async with self.lanes.hold(agent_key(PLATFORM, str(payload["user_id"]))):
            message = await self._fetch_again(payload)
            text = self.addressed_text(message) if message is not None else None
            if message is None or text is None:
                await self.bot.finished(event_id)
                return
            await self._answer(message, text, durable=True)

    async def _fetch_again(self, payload: Mapping[str, Any]) -> discord.Message | None:
        """The recorded message as it is now; None if it was deleted or can no longer be read.
        Other failures (network, 5xx) are raised: the event is kept for the next start."""
        channel_id = int(payload["channel_id"])
        cached = self.client.get_channel(channel_id)
        channel: discord.abc.Messageable
        if isinstance(cached, discord.abc.Messageable):
            channel = cached
        else:  # a DM channel is not cached after a restart
            guild_id = payload.get("guild_id")
            channel = self.client.get_partial_messageable(channel_id, guild_id=int(guild_id) if guild_id else None)
        try:
            return await channel.fetch_message(int(payload["message_id"]))
        except (discord.NotFound, discord.Forbidden) as error:
            log.warning(
                "not redoing message %s of Discord user %s: it is gone (%s %s)",
                payload["message_id"],
                payload["user_id"],
                error.status,
                error.text or error,
            )
            return None

    # -- delivery --------------------------------------------------------------
    async def wait_ready(self) -> None:
        """Return once the gateway session is ready, so deliveries can go out."""
        await self.client.wait_until_ready()

    async def deliver(self, replies: Sequence[Reply], *, channel: discord.abc.Messageable | None = None) -> None:
        """Send replies in order to `channel`, or where each reply's `reply_to` says (a channel id,
        else the user's DMs, else `fallback_channel_id` when their DMs are closed), and report
        each one with an outbox entry to the bot. A failure is logged; while a reply waits for a
        retry, that person's later replies are held behind it (Lanes.deliver), so no later part
        arrives before an earlier one."""

        async def send(reply: Reply) -> tuple[Delivery, str]:
            return await self._send(reply, channel)

        await self.lanes.deliver(replies, send, self.bot.report_delivery if self._durable else None)

    async def _send(self, reply: Reply, channel: discord.abc.Messageable | None) -> tuple[Delivery, str]:
        if not reply.text.strip():
            return Delivery.SENT, ""  # nothing to show: done
        where = reply.reply_to
        user_id = int(where["user_id"])
        try:
            target = channel or await self._target(where)
            await self._post(target, reply, mention=user_id if where.get("guild") else None)
        except discord.Forbidden as error:
            fallback = self._fallback(where)
            if fallback is None:
                return self._failed(reply, error)
            log.info(
                "could not reach Discord user %s directly (%s); using channel %s",
                reply.user_id,
                describe_error(error),
                getattr(fallback, "id", "?"),
            )
            try:
                await self._post(fallback, reply, mention=user_id)
            except CALL_ERRORS as second:
                return self._failed(reply, second)
        except CALL_ERRORS as error:
            return self._failed(reply, error)
        return Delivery.SENT, ""

    async def _post(self, channel: discord.abc.Messageable, reply: Reply, *, mention: int | None) -> None:
        """One reply as messages under the limit; in shared channels the first pings its user.
        A durable reply's parts carry nonces, and a resent one skips the parts already there."""
        prefix = f"<@{mention}> " if mention is not None else ""
        allowed = (
            discord.AllowedMentions(everyone=False, roles=False, users=[discord.Object(id=mention)])
            if (mention is not None)
            else discord.AllowedMentions.none()
        )
        chunks = split_message(reply.text, MESSAGE_LIMIT - len(prefix))
        chunks[0] = prefix + chunks[0]
        posted = await self._parts_posted(channel, reply, chunks) if reply.resend and reply.outbox_id else 0
        for part in range(posted, len(chunks)):
            extra: dict[str, Any] = {"nonce": nonce_of(reply.outbox_id, part)} if reply.outbox_id else {}
            await channel.send(chunks[part], allowed_mentions=allowed, **extra)

    async def _parts_posted(self, channel: discord.abc.Messageable, reply: Reply, chunks: Sequence[str]) -> int:
        """How many of the reply's first parts are already in the channel (its recent history)."""
        me = self.client.user
        if me is None:
            return 0
        try:
            recent = [message async for message in channel.history(limit=HISTORY_LIMIT)]
        except CALL_ERRORS as error:
            # Without history access, sending twice beats never sending (and the nonce may still catch it).
            log.warning(
                "cannot check channel %s for reply %s before sending it again: %s",
                getattr(channel, "id", "?"),
                reply.outbox_id,
                describe_error(error),
            )
            return 0
        since = snowflake_of(reply.event_id)  # the answered message: its replies are newer
        posted = 0
        for message in sorted(recent, key=lambda message: message.id):
            if posted == len(chunks):
                break
            if message.author.id != me.id or (since is not None and message.id <= since):
                continue
            if message.nonce is not None:  # only in messages this process saw created
                same = str(message.nonce) == nonce_of(reply.outbox_id, posted)
            else:
                same = message.content.strip() == chunks[posted].strip()
            if same:
                posted += 1
        if posted:
            log.info(
                "reply %s to Discord user %s: %d of %d parts were already sent",
                reply.outbox_id,
                reply.user_id,
                posted,
                len(chunks),
            )
        return posted

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
    def _failed(reply: Reply, error: BaseException) -> tuple[Delivery, str]:
        outcome, detail = outcome_of(error), describe_error(error)
        # Who and why, never what: the reply's text stays out of the logs.
        log.warning(
            "could not send a reply to Discord user %s (event %s, channel %s): %s; %s",
            reply.user_id,
            reply.event_id,
            reply.reply_to.get("channel_id") or "DM",
            detail,
            "will retry" if outcome is Delivery.RETRY else "dropped",
        )
        return outcome, detail


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
    if isinstance(channel, discord.PartialMessageable) and channel.guild is not None:
        return f"a channel in {channel.guild.name}"  # refetched after a restart, not in the cache
    return "DM"


def _media_type(attachment: discord.Attachment) -> str:
    return (attachment.content_type or "").split(";")[0].strip().lower()


def _size(size: int) -> str:
    if size >= 100 * 1024:
        return f"{size / (1024 * 1024):.1f} MB"
    return f"{max(1, round(size / 1024))} KB"


__all__ = ["DEFAULT_MAX_UPLOAD_BYTES", "SORRY", "DiscordAdapter", "DiscordConfig", "dm_address", "intents", "nonce_of"]
