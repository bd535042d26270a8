"""The Slack adapter: Events API in (Socket Mode or HTTP), chat.postMessage out.

Slack's side of the platform contract (adapters/pipeline.py): each Slack
payload is read by one small listener that drops what the bot must not answer
(adapters/slack/parse.py: `envelope_of_<event>`) and hands an `Arrival` to the
pipeline, which records it in the bot's inbox before the listener returns:
Bolt acks an event only then (`process_before_response=True`), so an event
Slack stops re-delivering is always one the bot has kept, and one that could
not be recorded is delivered again (`redelivers`). The listeners only record
and schedule work, so the agent's LLM calls never delay the HTTP response or
the Socket Mode ack. `build` (`SlackParser.parse_<kind>`) turns a recorded
payload into typed events (`UserMessage`, `UserJoined`, `FileUploaded`), the
same way at a replay. Replies carry their outbox id in message metadata, so a
reply re-sent after a crash is first looked for in the conversation
(adapters/slack/send.py). Slack's retried deliveries are dropped by Events
API `event_id` (the inbox's key).

Listening channels (bot/channels/port.py): in a `listen` or `open` channel
every person's message is handed to the bot's `hear` before the listener
returns, so before Bolt acknowledges it (adapters/slack/listening.py); edits
and deletions there are applied to what was kept.

Like every adapter it knows nothing of memory: it calls only the bot's ports
(`EventPort` for events, bot/commands/ for slash commands, `ChannelPort`).
Its parts, one job each: `app` (the Bolt app and its connection), `parse`
(payloads into typed events), `send` (replies out), `directory` (names),
`files` (shared files), `commands` (slash commands), `format` (mrkdwn),
`listening` (listening channels).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

from slack_bolt.async_app import AsyncBoltContext, AsyncBoltRequest

from adapters.pipeline import Arrival, Item, OnPipeline, Pipeline
from adapters.slack.app import SlackApp
from adapters.slack.commands import SlackCommands
from adapters.slack.config import PLATFORM, SlackConfig
from adapters.slack.directory import Directory
from adapters.slack.files import FileReader
from adapters.slack.history import ChannelHistory
from adapters.slack.listening import DELETED, EDITED, SlackListening, in_a_channel
from adapters.slack.parse import (
    Envelope,
    SlackParser,
    envelope_of_app_mention,
    envelope_of_member_joined_channel,
    envelope_of_message,
    envelope_of_team_join,
    is_from_a_bot,
    message_kind,
)
from adapters.slack.send import SlackSender
from bot.channels.port import Mode
from bot.events import Delivery, Reply
from bot.ports import AdapterPort

log = logging.getLogger(__name__)

# Plain messages; a file share or a join is never merged with another event.
DEBOUNCED = frozenset({"message", "app_mention"})


class SlackAdapter(OnPipeline):
    """One Bolt app serving every event; `start()` runs until `close()`."""

    name = PLATFORM
    redelivers = True  # Slack retries an event it got no acknowledgement for

    def __init__(self, bot: AdapterPort, config: SlackConfig) -> None:
        self.bot = bot
        self.config = config
        self.app = SlackApp(config)
        self.client = self.app.client
        self.directory = Directory(self.client)
        history = ChannelHistory(self.client, self.directory, config.channel_context_messages)
        self.parser = SlackParser(self.directory, FileReader(self.client, config), history)
        self.sender = SlackSender(self.client, self.directory)
        self.listening = SlackListening(bot, config, self.directory)
        bolt = self.app.bolt
        bolt.event("message")(self._on_message)
        bolt.event("app_mention")(self._on_app_mention)
        bolt.event("team_join")(self._on_team_join)
        bolt.event("member_joined_channel")(self._on_member_joined_channel)
        self.commands = SlackCommands(bolt, bot, self.listening, self._post_notice)
        self.pipeline = Pipeline(bot, self, getattr(bot, "debounce_seconds", 0.0))
        self._closed = asyncio.Event()
        self._ready = asyncio.Event()
        self._closing = False

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        """Connect (Socket Mode) or listen (HTTP mode), then run until `close()`."""
        await self.connect()
        await self._closed.wait()

    async def connect(self) -> None:
        """Check the credentials and start receiving events; returns once ready."""
        if await self.app.connect(self._identify):
            self._ready.set()

    def _identify(self, auth: Mapping[str, Any]) -> None:
        self.directory.bot_user_id = auth.get("user_id")
        self.directory.bot_name = str(auth.get("user") or self.directory.bot_name)
        if auth.get("team_id") and auth.get("team"):
            self.directory.team_names[str(auth["team_id"])] = str(auth["team"])

    async def wait_ready(self) -> None:
        """Return once connected (Socket Mode) or listening (HTTP mode)."""
        await self._ready.wait()

    @property
    def port(self) -> int | None:
        """The bound HTTP port in HTTP mode once listening (useful with port 0), else None."""
        return self.app.port

    async def close(self, grace: float = 10.0) -> None:
        """Stop receiving, give work in flight `grace` seconds to finish, then cancel it."""
        if self._closing:
            return
        self._closing = True
        try:
            await self.app.stop_receiving()
            await asyncio.gather(self.pipeline.close(grace), self.commands.close(grace))
        finally:
            await self.app.close()
            self._closed.set()

    # -- listeners: filter, then hand the event on ---------------------------
    def _own_id(self, context: AsyncBoltContext) -> str | None:
        return context.bot_user_id or self.directory.bot_user_id

    async def _on_message(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext, request: AsyncBoltRequest
    ) -> None:
        own = self._own_id(context)
        mode: Mode = "mention"
        # Never a DM (not even through the check): what is said there is no channel's.
        if event.get("channel_type") != "im" and in_a_channel(event):
            if event.get("subtype") in (EDITED, DELETED):
                await self.listening.changed(body, event)
                return
            if not is_from_a_bot(event, own):
                mode = await self._hear(body, event)
        envelope = envelope_of_message(body, event, own, open_here=mode == "open")
        if envelope is None:
            return
        retry = request.headers.get("x-slack-retry-num", [None])[0]
        if retry and retry != "0":
            log.info(
                "slack: retry %s of event %s (%s)",
                retry,
                body.get("event_id"),
                request.headers.get("x-slack-retry-reason", ["?"])[0],
            )
        await self._take(envelope, message_kind(event), event)

    async def _on_app_mention(self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext) -> None:
        own = self._own_id(context)
        # Kept too where the channel listens (a repeat of its message event is kept once).
        mode = await self._hear(body, event) if not is_from_a_bot(event, own) else "mention"
        envelope = envelope_of_app_mention(body, event, own, open_here=mode == "open")
        if envelope is not None:
            await self._take(envelope, "app_mention", event)

    async def _hear(self, body: dict[str, Any], event: dict[str, Any]) -> Mode:
        """The channel's mode, the message kept first where it listens (raising, unacknowledged,
        when it cannot be), and the listening notice posted the first time."""
        mode, notice = await self.listening.hear(body, event)
        if notice:
            self._post_notice(str(event["channel"]), notice)
        return mode

    def _post_notice(self, channel: str, text: str) -> None:
        """Say the listening notice in the channel (after the acknowledgement: a task of the pipeline's)."""
        notice = Reply(text, PLATFORM, f"channel:{channel}", {"channel": channel}, f"notice:{channel}")
        self.pipeline.send_later([notice])

    async def _on_team_join(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        envelope = envelope_of_team_join(body, event)
        if envelope is not None:
            self.directory.learn(envelope.team, envelope.user, event["user"])
            await self._take(envelope, "team_join", event)

    async def _on_member_joined_channel(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        envelope = envelope_of_member_joined_channel(body, event, self._own_id(context))
        if envelope is not None:
            await self._take(envelope, "member_joined_channel", event)

    async def _take(self, envelope: Envelope, kind: str, event: Mapping[str, Any]) -> None:
        """Into the pipeline, which records it before Bolt acknowledges it (a repeat is dropped there)."""
        await self.pipeline.take(
            self._arrival(envelope, {"kind": kind, "event": dict(event), "origin": envelope.to_json()})
        )

    # -- the platform contract (adapters/pipeline.py) -----------------------------
    def arrival_of(self, payload: Mapping[str, Any]) -> Arrival:
        return self._arrival(Envelope.from_json(payload["origin"]), payload)

    @staticmethod
    def _arrival(envelope: Envelope, payload: Mapping[str, Any]) -> Arrival:
        return Arrival(
            event_id=envelope.event_id,
            user_id=envelope.user_id,
            conversation=str(envelope.reply_to.get("channel", "")),
            payload=dict(payload),
            mergeable=payload["kind"] in DEBOUNCED,
            awaits_answer=envelope.awaits_answer,
            live=envelope,
        )

    async def build(self, arrival: Arrival) -> list[Item]:
        payload = arrival.payload
        return await self.parser.parse(str(payload["kind"]), arrival.live, payload["event"])

    async def send(self, reply: Reply, answering: Arrival | None) -> tuple[Delivery, str]:
        return await self.sender.send(reply)

    def notice(self, arrival: Arrival, text: str) -> Reply:
        envelope: Envelope = arrival.live
        return envelope.notice(text)

    def working(self, arrival: Arrival) -> AbstractAsyncContextManager[None]:
        return nullcontext()  # a bot user cannot show Slack's typing indicator
