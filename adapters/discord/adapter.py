"""The Discord adapter: gateway events in, the agent's replies out.

Like discord.py's own connection state, which turns each raw payload into a
typed model in one small `parse_<event>` method and then dispatches it, each
Discord event here is turned into a typed bot event by one small function
(adapters/discord/parse.py) and handed on by one handler (`on_message`,
`on_member_join`), which gives it to the bot and delivers the replies
(adapters/discord/send.py). The adapter only ever calls the bot's port
(`handle`, `memory_report`, `forget_user`, and the journal calls below); it
knows nothing of memory. The client itself is built and run in
adapters/discord/client.py.

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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import discord
from discord import app_commands

from adapters.channels import ContextFailures
from adapters.discord.client import build_client, log_ready, run_client, sync_commands
from adapters.discord.commands import FORGET_TIMEOUT, add_commands
from adapters.discord.config import PLATFORM, DiscordConfig
from adapters.discord.parse import (
    addressed_text,
    channel_line,
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
from bot.durable.debounce import Burst, Debouncer, merge
from bot.durable.lanes import Lanes
from bot.events import ChannelLine, Delivery, Event, Place, Redo, Reply, UserJoined, agent_key
from bot.ports import BotPort

log = logging.getLogger(__name__)

CONTEXT_ADVICE = "give the bot the Read Message History permission there (docs/discord.md)"


@dataclass(eq=False)
class _Arrival:
    """A message on its way in; `recorded` is set once the journal has (or could not take) it."""

    message: discord.Message
    text: str
    durable: bool | None = None  # as `_record` says
    recorded: asyncio.Event = field(default_factory=asyncio.Event)


SORRY = "Sorry, something went wrong on my side and I could not answer that. Please try again in a moment."


class DiscordAdapter:
    """Runs the bot on Discord: `await adapter.start()` until `await adapter.close()`."""

    def __init__(self, bot: BotPort, config: DiscordConfig, *, forget_timeout: float = FORGET_TIMEOUT) -> None:
        self.bot = bot
        self.config = config
        self._closing = False
        self.client = build_client(config)
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
        # Quick messages of one person in one channel: one event (bot/durable/debounce.py).
        self.bursts: Debouncer[_Arrival] = Debouncer(getattr(bot, "debounce_seconds", 0.0) if self._durable else 0.0)
        self.context_failures = ContextFailures(PLATFORM, CONTEXT_ADVICE)
        for handler in (self.on_ready, self.on_message, self.on_member_join):
            self.client.event(handler)
        self.client.setup_hook = self.sync_commands  # type: ignore[method-assign]

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Log in and connect (retrying while Discord is unreachable); returns once the client
        is closed. Raises discord.LoginFailure for a bad token and discord.PrivilegedIntentsRequired
        when the portal switches are off (adapters/discord/client.py)."""
        await run_client(self.client, self.config.token, lambda: self._closing)

    async def close(self) -> None:
        self._closing = True
        await self.client.close()

    async def sync_commands(self) -> None:
        """Publish /memory, /forget and /checkin (runs once, after login)."""
        await sync_commands(self.tree, self.config.command_guild_id)

    async def on_ready(self) -> None:
        log_ready(self.client, self.config)

    async def wait_ready(self) -> None:
        """Return once the gateway session is ready, so deliveries can go out."""
        await self.client.wait_until_ready()

    # -- handlers: record the event, hand it to the bot, deliver the replies -------
    async def on_message(self, message: discord.Message) -> None:
        text = addressed_text(message, self.client.user, self.config.always_on_channels)
        if text is None:
            return
        key, arrival = agent_key(PLATFORM, str(message.author.id)), _Arrival(message, text)
        if text and not message.attachments:  # a plain message may join the person's open burst here
            burst = self.bursts.join(f"{key} {message.channel.id}", arrival)
        else:
            burst = Burst([arrival], 0.0, 0.0, closed=True)
        if burst is None:
            # The burst's leader answers it; kept in the journal now (Discord never sends it again).
            await self._record_arrival(arrival)
            return
        # Entered before any await: see self.lanes.
        async with self.lanes.hold(key):
            await self._record_arrival(arrival)
            await self._answer_burst(await self.bursts.gather(burst))

    async def _record_arrival(self, arrival: _Arrival) -> None:
        try:
            arrival.durable = await self._record(message_payload(arrival.message))
        finally:
            arrival.recorded.set()

    async def _answer_burst(self, arrivals: Sequence[_Arrival]) -> None:
        """One event for a burst that can merge (bot/durable/debounce.py), else each message on its own."""
        for arrival in arrivals:
            await arrival.recorded.wait()
        kept = [arrival for arrival in arrivals if arrival.durable is not None]  # not repeats
        batch = None
        if len(kept) > 1 and all(arrival.durable for arrival in kept):
            first = kept[0].message
            place = place_of(first.channel)
            # The channel's lines before the first message: the later ones are the person's own, in the batch.
            context = await self._channel_context(first, place)
            batch = merge(
                [
                    [parse_message(a.message, a.text, durable=True, place=place, context=[] if n else context)]
                    for n, a in enumerate(kept)
                ]
            )
        if batch is None:
            for arrival in kept:
                await self._answer(arrival.message, arrival.text, durable=bool(arrival.durable))
            return
        channel = kept[0].message.channel
        await self.deliver(await self._handle(batch, channel), channel=channel)
        for arrival in kept:
            await self.bot.finished(str(arrival.message.id))

    async def on_member_join(self, member: discord.Member) -> None:
        if member.bot:
            return
        payload = join_payload(member)
        event = parse_member_join(payload)
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

    async def _answer(self, message: discord.Message, text: str, *, durable: bool, place: Place | None = None) -> None:
        channel = message.channel
        place = place or place_of(channel)  # a replay's is the one recorded with it
        # Files first, so the agent has read them by the time it answers the text.
        for attachment in message.attachments:
            await self.deliver(await self._upload(message, attachment, place, durable=durable), channel=channel)
        if text:
            context = await self._channel_context(message, place)
            event = parse_message(message, text, durable=durable, place=place, context=context)
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
        self, message: discord.Message, attachment: discord.Attachment, place: Place, *, durable: bool = False
    ) -> list[Reply]:
        reason = refusal(attachment, self.config.max_upload_bytes)
        if reason is None:
            try:
                data = await attachment.read()
            except CALL_ERRORS as error:
                log.warning("could not download attachment %s of message %s: %s", attachment.id, message.id, error)
                reason = f"I couldn't download {attachment.filename}; please try again."
            else:
                event = parse_attachment(message, attachment, data, durable=durable, place=place)
                return await self._handle(event, message.channel)
        return [Reply(reason, PLATFORM, str(message.author.id), reply_to(message), f"{message.id}:{attachment.id}")]

    async def _handle(self, event: Event, channel: discord.abc.Messageable | None) -> list[Reply]:
        async with typing(channel):
            try:
                return await self.bot.handle(event)
            except Exception:
                log.exception("handling %s %s of Discord user %s failed", event.kind, event.event_id, event.user_id)
                return [event.reply(SORRY)]

    # -- crash recovery ----------------------------------------------------------
    def hold_new_events(self) -> None:
        """New events wait until `recover` has put the last run's unfinished ones in line."""
        self.lanes.hold_back()

    async def recover(self) -> int:
        """Replay the events a crash left unfinished, in arrival order, and wait for them; the
        number replayed. Call once connected (cli/app.py does), before check-ins start."""
        try:
            redos = await self.bot.pending_events(PLATFORM) if self._durable else []
        except BaseException:
            self.lanes.release()
            raise
        return await self.replay(redos)

    async def replay(self, redos: Sequence[Redo]) -> int:
        """Handle recorded events again, in order, and wait for them; how many."""
        # One task per event, created in arrival order: each joins its user's lane before its
        # first await, so one user's events are redone in order while different users' overlap.
        tasks = [asyncio.create_task(self._replay(redo), name=f"discord-replay-{redo.event_id}") for redo in redos]
        self.lanes.release()  # after the replays' tasks: they join their lanes first
        for redo, outcome in zip(redos, await asyncio.gather(*tasks, return_exceptions=True), strict=True):
            if isinstance(outcome, Exception):
                # Left unfinished: the next start tries it again (bot/durable/inbox.py caps the restarts).
                log.error("replaying Discord event %s failed", redo.event_id, exc_info=outcome)
        return len(redos)

    async def _replay(self, redo: Redo) -> None:
        payload, event_id = redo.payload, redo.event_id
        kind = payload.get("kind")
        if redo.notice:  # given up: the person is told, instead of a redo
            async with self.lanes.hold(agent_key(PLATFORM, str(payload["user_id"])), early=True):
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
            event = parse_member_join(payload)
            event.durable = True
            async with self.lanes.hold(event.agent_key, early=True):
                await self._greet(event, None)  # to reply_to: the DM, else the system channel
            return
        if kind != "message":
            log.error("cannot replay Discord event %s of unknown kind %r; dropping it", event_id, kind)
            await self.bot.finished(event_id)
            return
        async with self.lanes.hold(agent_key(PLATFORM, str(payload["user_id"])), early=True):
            message = await self._fetch_again(payload)
            text = (
                addressed_text(message, self.client.user, self.config.always_on_channels)
                if message is not None
                else None
            )
            if message is None or text is None:
                await self.bot.finished(event_id)
                return
            await self._answer(message, text, durable=True, place=place_from_json(payload.get("place")))

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
    async def deliver(self, replies: Sequence[Reply], *, channel: discord.abc.Messageable | None = None) -> None:
        """Send replies in order to `channel`, or where each reply's `reply_to` says (a channel id,
        else the user's DMs, else `fallback_channel_id` when their DMs are closed), and report
        each one with an outbox entry to the bot. A failure is logged; while a reply waits for a
        retry, that person's later replies are held behind it (Lanes.deliver), so no later part
        arrives before an earlier one."""

        async def send(reply: Reply) -> tuple[Delivery, str]:
            return await send_reply(self.client, reply, channel)

        await self.lanes.deliver(replies, send, self.bot.report_delivery if self._durable else None)
