"""The Discord adapter: gateway events in, the agent's replies out.

Discord's side of the platform contract (adapters/pipeline.py). Like
discord.py's own connection state, which turns each raw payload into a typed
model in one small `parse_<event>` method and then dispatches it, each
Discord event here is turned into a typed bot event by one small function
(adapters/discord/parse.py); the handlers (`on_message`, `on_member_join`)
hand an `Arrival` to the pipeline, which records it, orders it, runs it
through the bot and delivers the replies (adapters/discord/send.py). The
adapter only ever calls the bot's port; it knows nothing of memory. The
client itself is built and run in adapters/discord/client.py.

Crash safety (bot/durable/__init__.py tells the protocol). Discord neither waits
for an acknowledgement nor delivers a gateway event again (`redelivers` is
False), so here the inbox is for redoing work a crash cut short, and an event
that cannot be recorded is answered all the same. Each message meant for the
bot and each join is recorded with what rebuilds it: a message by channel and
message id (fetched again at replay, its files downloaded again; a message
deleted meanwhile is skipped; one Discord cannot give now is kept for the next
start), a join by the few fields its event needs (no fetch).

Listening channels (bot/channels/port.py, adapters/discord/listening.py): in a
`listen` or `open` channel every person's message is handed to the bot's
`hear` before it goes on (a mention is answered as ever); MESSAGE_UPDATE and
MESSAGE_DELETE (raw: the message need not be cached) are applied to what was
kept. A DM never passes through there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import discord
from discord import app_commands

from adapters.channels import ContextFailures
from adapters.discord.client import build_client, log_ready, run_client, sync_commands
from adapters.discord.commands import FORGET_TIMEOUT, add_commands
from adapters.discord.config import PLATFORM, DiscordConfig
from adapters.discord.listening import DiscordListening
from adapters.discord.parse import (
    addressed_text,
    channel_line,
    from_a_person,
    join_payload,
    message_payload,
    parse_attachment,
    parse_member_join,
    parse_message,
    place_from_json,
    place_of,
    refusal,
    reply_to,
)
from adapters.discord.send import CALL_ERRORS, send_reply, typing
from adapters.pipeline import Arrival, Item, OnPipeline, Pipeline, Unfinished
from bot.channels.port import Mode
from bot.events import ChannelLine, Delivery, Place, Reply
from bot.ports import AdapterPort

log = logging.getLogger(__name__)

CONTEXT_ADVICE = "give the bot the Read Message History permission there (docs/discord.md)"


class DiscordAdapter(OnPipeline):
    """Runs the bot on Discord: `await adapter.start()` until `await adapter.close()`."""

    name = PLATFORM
    redelivers = False  # a gateway event comes once

    def __init__(self, bot: AdapterPort, config: DiscordConfig, *, forget_timeout: float = FORGET_TIMEOUT) -> None:
        self.bot = bot
        self.config = config
        self._closing = False
        self.client = build_client(config)
        self.tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(self.client)
        self.listening = DiscordListening(bot, config, self.client)
        add_commands(self.tree, bot, self.listening, self._post_notice, forget_timeout=forget_timeout)
        self.pipeline = Pipeline(bot, self, getattr(bot, "debounce_seconds", 0.0))
        self.context_failures = ContextFailures(PLATFORM, CONTEXT_ADVICE)
        handlers = (
            self.on_ready,
            self.on_message,
            self.on_member_join,
            self.on_raw_message_edit,
            self.on_raw_message_delete,
            self.on_raw_bulk_message_delete,
        )
        for handler in handlers:
            self.client.event(handler)
        self.client.setup_hook = self.sync_commands  # type: ignore[method-assign]

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Log in and connect (retrying while Discord is unreachable); returns once the client
        is closed. Raises discord.LoginFailure for a bad token and discord.PrivilegedIntentsRequired
        when the portal switches are off (adapters/discord/client.py)."""
        await run_client(self.client, self.config.token, lambda: self._closing)

    async def close(self, grace: float = 10.0) -> None:
        """Give work in flight `grace` seconds to finish (events arriving meanwhile are kept
        for the next start), then disconnect."""
        self._closing = True
        try:
            await self.pipeline.close(grace)
        finally:
            await self.client.close()

    async def sync_commands(self) -> None:
        """Publish /memory, /forget and /checkin (runs once, after login)."""
        await sync_commands(self.tree, self.config.command_guild_id)

    async def on_ready(self) -> None:
        log_ready(self.client, self.config)

    async def wait_ready(self) -> None:
        """Return once the gateway session is ready, so deliveries can go out."""
        await self.client.wait_until_ready()

    # -- handlers: into the pipeline ---------------------------------------------
    async def on_message(self, message: discord.Message) -> None:
        mode: Mode = "mention"
        if message.guild is not None and from_a_person(message, self.client.user):  # never a DM
            mode = await self._hear(message)
        text = addressed_text(message, self.client.user, open_here=mode == "open")
        if text is None:
            return
        arrival = Arrival(
            event_id=str(message.id),
            user_id=str(message.author.id),
            conversation=str(message.channel.id),
            # In a server, whether its channel was open: a replay answers it the same way.
            payload=message_payload(message) | ({"open": mode == "open"} if message.guild is not None else {}),
            mergeable=bool(text) and not message.attachments,  # a plain message may join the person's burst
            live=message,
        )
        await self._run(arrival)

    async def _hear(self, message: discord.Message) -> Mode:
        """The channel's mode, the message kept first where it listens, the notice posted
        the first time. Discord sends an event once: a failure to keep is logged, and a
        mention is answered all the same (by the operator's mode for the channel)."""
        try:
            mode, notice = await self.listening.hear(message)
        except Exception:
            log.exception("discord: could not keep message %s of channel %s", message.id, message.channel.id)
            assert message.guild is not None
            return self.listening.mode_ref(message.channel, message.guild.id)[1]
        if notice:
            self._post_notice(message.channel.id, notice)
        return mode

    def _post_notice(self, channel_id: int, text: str) -> None:
        """Say the listening notice in the channel, from a task of the pipeline's."""
        where = {"channel_id": channel_id, "guild": False, "user_id": 0}  # no one to mention
        self.pipeline.send_later([Reply(text, PLATFORM, f"channel:{channel_id}", where, f"notice:{channel_id}")])

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        await self.listening.edited(payload)

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        await self.listening.deleted(payload.guild_id, payload.channel_id, {payload.message_id})

    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        await self.listening.deleted(payload.guild_id, payload.channel_id, payload.message_ids)

    async def on_member_join(self, member: discord.Member) -> None:
        if member.bot:
            return
        arrival = self.arrival_of(join_payload(member))
        arrival.live = member  # the greeting goes to the newcomer's DMs
        await self._run(arrival)

    async def _run(self, arrival: Arrival) -> None:
        task = await self.pipeline.take(arrival)
        if task is not None:  # nothing to acknowledge: the handler ends with the answer
            await task

    # -- the platform contract (adapters/pipeline.py) -----------------------------
    def arrival_of(self, payload: Mapping[str, Any]) -> Arrival:
        return Arrival(
            event_id=str(payload["event_id"]),
            user_id=str(payload["user_id"]),
            conversation=str(payload.get("channel_id") or ""),
            payload=dict(payload),
            awaits_answer=payload.get("kind") == "message",  # only someone who wrote waits for an answer
        )

    async def build(self, arrival: Arrival) -> list[Item]:
        payload = arrival.payload
        kind = payload.get("kind")
        if kind == "join":
            event = parse_member_join(payload)
            event.in_inbox = arrival.in_inbox
            return [event]
        if kind != "message":
            log.error("cannot handle Discord event %s of unknown kind %r; dropping it", arrival.event_id, kind)
            return []
        message = arrival.live if isinstance(arrival.live, discord.Message) else await self._fetch_again(payload)
        arrival.live = message
        # Open where it was received (recorded); entries from before modes: the setting's.
        open_here = bool(payload.get("open", message is not None and self._always_on(message)))
        text = addressed_text(message, self.client.user, open_here) if message else None
        if message is None or text is None:
            return []
        # A replay's place is the one recorded with it.
        place = place_from_json(payload.get("place")) or place_of(message.channel)
        # Files first, so the agent has read them by the time it answers the text.
        items: list[Item] = [
            await self._upload(message, attachment, place, in_inbox=arrival.in_inbox)
            for attachment in message.attachments
        ]
        if text:
            context = await self._channel_context(message, place)
            items.append(parse_message(message, text, in_inbox=arrival.in_inbox, place=place, context=context))
        return items

    async def send(self, reply: Reply, answering: Arrival | None) -> tuple[Delivery, str]:
        return await send_reply(self.client, reply, self._channel_of(answering))

    def notice(self, arrival: Arrival, text: str) -> Reply:
        if isinstance(arrival.live, discord.Message):
            where = reply_to(arrival.live)
        elif arrival.payload.get("kind") == "message":
            payload = arrival.payload
            where = {
                "channel_id": int(payload["channel_id"]),
                "guild": payload.get("guild_id") is not None,
                "user_id": int(payload["user_id"]),
            }
        else:
            where = parse_member_join(arrival.payload).reply_to
        return Reply(text, PLATFORM, arrival.user_id, where, arrival.event_id)

    def working(self, arrival: Arrival) -> AbstractAsyncContextManager[None]:
        return typing(arrival.live.channel if isinstance(arrival.live, discord.Message) else None)

    def _always_on(self, message: discord.Message) -> bool:
        if message.guild is None:
            return False
        return self.listening.mode_ref(message.channel, message.guild.id)[1] == "open"

    @staticmethod
    def _channel_of(arrival: Arrival | None) -> discord.abc.Messageable | None:
        """Where the answer to a live event goes (a replay's goes where its reply says)."""
        live = arrival.live if arrival is not None else None
        if isinstance(live, discord.Message):
            return live.channel
        return live if isinstance(live, discord.Member) else None

    # -- what building a message reads ------------------------------------------------
    async def _channel_context(self, message: discord.Message, place: Place) -> list[ChannelLine]:
        """The messages before this one in its channel or thread, oldest first (none in a DM);
        without them, if the bot may not read them (logged once per channel)."""
        limit = self.config.channel_context_messages
        if place.is_dm or limit <= 0:
            return []
        try:
            earlier = [line async for line in message.channel.history(limit=limit, before=message)]
        except CALL_ERRORS as error:
            return self.context_failures.failed(str(message.channel.id), f"{type(error).__name__}: {error}")
        # Oldest first, by snowflake (time-ordered): whatever order the API listed them in.
        lines = (channel_line(line, self.client.user) for line in sorted(earlier, key=lambda line: line.id))
        return [line for line in lines if line is not None]

    async def _upload(
        self, message: discord.Message, attachment: discord.Attachment, place: Place, *, in_inbox: bool
    ) -> Item:
        reason = refusal(attachment, self.config.max_upload_bytes)
        if reason is None:
            try:
                data = await attachment.read()
            except CALL_ERRORS as error:
                log.warning("could not download attachment %s of message %s: %s", attachment.id, message.id, error)
                reason = f"I couldn't download {attachment.filename}; please try again."
            else:
                return parse_attachment(message, attachment, data, in_inbox=in_inbox, place=place)
        return Reply(reason, PLATFORM, str(message.author.id), reply_to(message), f"{message.id}:{attachment.id}")

    async def _fetch_again(self, payload: Mapping[str, Any]) -> discord.Message | None:
        """The recorded message as it is now; None if it was deleted or can no longer be read.
        Other failures (network, 5xx) leave the event for the next start (Unfinished)."""
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
        except CALL_ERRORS as error:
            raise Unfinished(f"cannot fetch message {payload['message_id']} again: {error}") from error
