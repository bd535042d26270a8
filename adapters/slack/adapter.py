"""The Slack adapter: Events API in (Socket Mode or HTTP), chat.postMessage out.

Each Slack payload is read by one small listener that drops what the bot must
not answer (adapters/slack/parse.py: `origin_of_<event>`), records the event
in the bot's journal (bot/durable/) and hands its builder to `_submit`; the
builder (`SlackParser.parse_<kind>`) turns the payload into typed events
(`UserMessage`, `UserJoined`, `FileUploaded`). Bolt acks an event only once its
listener returns (`process_before_response=True`): an event Slack stops
re-delivering is always one the bot has kept. The listeners only record and
schedule work, so the agent's LLM calls never delay the HTTP response or the
Socket Mode ack. Replies carry their outbox id in message metadata, so a reply
re-sent after a crash is first looked for in the conversation (adapters/slack/send.py).

Work for one user runs in arrival order (their lane, bot/durable/lanes.py,
taken before any await) so that reading the display name or downloading a
file cannot let a later message overtake an earlier one; different users run
concurrently. Replies keep that order too: while one waits for a retry, the
same person's later replies wait behind it (Lanes.deliver).
Slack's retried deliveries are dropped by Events API `event_id` (the journal's key).

Like every adapter it knows nothing of memory: it calls only the `BotPort`.
Its parts, one job each: `app` (the Bolt app and its connection), `parse`
(payloads into typed events), `send` (replies out), `directory` (names),
`files` (shared files), `commands` (slash commands), `format` (mrkdwn).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from slack_bolt.async_app import AsyncBoltContext, AsyncBoltRequest

from adapters.slack.app import SlackApp
from adapters.slack.commands import add_commands
from adapters.slack.config import PLATFORM, SlackConfig
from adapters.slack.dedupe import EventDeduper, RecentEventIds
from adapters.slack.directory import Directory
from adapters.slack.files import FileReader
from adapters.slack.history import ChannelHistory
from adapters.slack.parse import (
    Builder,
    Item,
    Origin,
    SlackParser,
    gave_up,
    message_kind,
    origin_of_app_mention,
    origin_of_member_joined_channel,
    origin_of_message,
    origin_of_team_join,
)
from adapters.slack.send import SlackSender
from bot.durable.debounce import Burst, Debouncer, merge
from bot.durable.lanes import Lanes
from bot.events import Redo, Reply, agent_key
from bot.ports import BotPort

log = logging.getLogger(__name__)

# Plain messages; a file share or a join is never merged with another event.
DEBOUNCED = frozenset({"message", "app_mention"})
Work = tuple[Origin, Builder]  # a recorded event and how to build it

APOLOGY = "Sorry, something went wrong on my side and I couldn't answer that. Please try again."


class SlackClosingError(Exception):
    """An event arrived while the adapter closes: not acknowledged, so Slack delivers it again."""


class SlackAdapter:
    """One Bolt app serving every event; `start()` runs until `close()`."""

    def __init__(self, bot: BotPort, config: SlackConfig, *, deduper: EventDeduper | None = None) -> None:
        self.bot = bot
        self.config = config
        self.deduper: EventDeduper = deduper or RecentEventIds()
        # A bot with a journal (the runtime) records events and replies so a
        # crash loses nothing (bot/durable/journal.py); simpler bots (tests) are
        # de-duplicated in memory and not replayed.
        self._durable = callable(getattr(bot, "receive", None))
        self.app = SlackApp(config)
        self.client = self.app.client
        self.directory = Directory(self.client)
        history = ChannelHistory(self.client, self.directory, config.channel_context_messages)
        self.parser = SlackParser(self.directory, FileReader(self.client, config), history)
        self.sender = SlackSender(self.client, self.directory)
        bolt = self.app.bolt
        bolt.event("message")(self._on_message)
        bolt.event("app_mention")(self._on_app_mention)
        bolt.event("team_join")(self._on_team_join)
        bolt.event("member_joined_channel")(self._on_member_joined_channel)
        add_commands(bolt, bot)
        self._lanes = Lanes()
        # Quick messages of one person in one place: one event (bot/durable/debounce.py).
        self._bursts: Debouncer[Work] = Debouncer(getattr(bot, "debounce_seconds", 0.0) if self._durable else 0.0)
        self._tasks: set[asyncio.Task[None]] = set()
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
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.drain()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            await self.app.close()
            self._closed.set()

    async def drain(self) -> None:
        """Wait until every event taken so far has been answered."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    # -- listeners: filter, then hand a builder on ---------------------------
    def _own_id(self, context: AsyncBoltContext) -> str | None:
        return context.bot_user_id or self.directory.bot_user_id

    async def _on_message(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext, request: AsyncBoltRequest
    ) -> None:
        origin = origin_of_message(body, event, self._own_id(context), self.config.always_on_channels)
        if origin is None:
            return
        retry = request.headers.get("x-slack-retry-num", [None])[0]
        if retry and retry != "0":
            log.info(
                "slack: retry %s of event %s (%s)",
                retry,
                body.get("event_id"),
                request.headers.get("x-slack-retry-reason", ["?"])[0],
            )
        await self._accept(origin, message_kind(event), event)

    async def _on_app_mention(self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext) -> None:
        origin = origin_of_app_mention(body, event, self._own_id(context), self.config.always_on_channels)
        if origin is not None:
            await self._accept(origin, "app_mention", event)

    async def _on_team_join(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        origin = origin_of_team_join(body, event)
        if origin is not None:
            self.directory.learn(origin.team, origin.user, event["user"])
            await self._accept(origin, "team_join", event)

    async def _on_member_joined_channel(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        origin = origin_of_member_joined_channel(body, event, self._own_id(context))
        if origin is not None:
            await self._accept(origin, "member_joined_channel", event)

    # -- taking an event: journal, then work ------------------------------------
    async def _accept(self, origin: Origin, kind: str, event: Mapping[str, Any]) -> None:
        """Record the event in the bot's journal (before Bolt acknowledges it)
        and queue its work; a repeat delivery is dropped here."""
        if self._closing:
            log.info("slack: closing; event %s left for Slack to deliver again", origin.event_id)
            raise SlackClosingError("closing")
        if self._durable:
            payload = {"kind": kind, "event": dict(event), "origin": origin.to_json()}
            if not await self.bot.receive(PLATFORM, origin.event_id, origin.user_id, payload):
                log.info("slack: event %s was already received; ignoring the repeat", origin.event_id)
                return
        elif await self.deduper.seen(origin.event_id):
            log.info("slack: event %s was already delivered; ignoring the retry", origin.event_id)
            return
        self._submit(origin, self.parser.builder(kind, origin, event), debounce=kind in DEBOUNCED)

    def hold_new_events(self) -> None:
        """New events wait until `recover` has put the last run's unfinished ones in line."""
        self._lanes.hold_back()

    async def recover(self) -> int:
        """Replay the events a crash left unfinished, in arrival order, and
        wait for them; the number replayed. Call once connected, before new work."""
        try:
            redos = await self.bot.pending_events(PLATFORM) if self._durable else []
        except BaseException:
            self._lanes.release()
            raise
        return await self.replay(redos)

    async def replay(self, redos: Sequence[Redo]) -> int:
        """Handle recorded events again, in order (through the users' lanes), and wait for them
        (only for them: new events keep arriving meanwhile on a busy bot, and the
        start-up waits for this before redelivery and check-ins begin)."""
        replays: list[asyncio.Task[None]] = []
        for redo in redos:
            origin = Origin.from_json(redo.payload["origin"])
            if redo.notice:  # given up: the person is told, instead of a redo
                task = self._submit(origin, gave_up(origin, redo.notice), early=True)
            else:
                build = self.parser.builder(str(redo.payload["kind"]), origin, redo.payload["event"])
                task = self._submit(origin, build, early=True)
            if task is not None:
                replays.append(task)
        self._lanes.release()  # after the replays' tasks: they join their lanes first
        if replays:
            await asyncio.wait(replays)
        return len(redos)

    # -- running the work ------------------------------------------------------
    def _submit(
        self, origin: Origin, build: Builder, *, early: bool = False, debounce: bool = False
    ) -> asyncio.Task[None] | None:
        """Start handling an event; its task, or None if it joined an open burst (or we are closing)."""
        if self._closing:
            log.info("slack: closing; dropping event %s", origin.event_id)
            return None
        # A message joins the person's open burst in this conversation, if any:
        # the burst's leader handles it (bot/durable/debounce.py). Replays never do.
        where = f"{origin.user_id} {origin.reply_to.get('channel', '')}"
        burst = (
            self._bursts.join(where, (origin, build)) if debounce else Burst([(origin, build)], 0.0, 0.0, closed=True)
        )
        if burst is None:
            return None
        # Our own task (not Bolt's untracked future) so close() can wait for it.
        task = asyncio.create_task(self._process(burst, early), name=f"slack-event-{origin.event_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _process(self, burst: Burst[Work], early: bool) -> None:
        # The first await: it fixes this event's (or burst's) place in line.
        async with self._lanes.hold(agent_key(PLATFORM, burst.leader[0].user_id), early=early):
            members = await self._bursts.gather(burst)
            built = [(origin, await self._build(origin, build)) for origin, build in members]
            readable = [items for _, items in built if items is not None]
            batch = merge(readable) if len(readable) == len(built) else None
            if batch is not None:
                await self._run(built[0][0], [batch])
                for origin, _ in built[1:]:
                    await self.bot.finished(origin.event_id)
            else:
                for origin, items in built:
                    await self._run(origin, items)

    async def _build(self, origin: Origin, build: Builder) -> list[Item] | None:
        """The event's items; None (logged) when they cannot be built."""
        try:
            return await build()
        except Exception:
            log.exception("slack: reading event %s failed", origin.event_id)
            return None

    async def _run(self, origin: Origin, items: list[Item] | None) -> None:
        """Hand the items of one recorded event to the bot, deliver the replies, finish it."""
        try:
            if items is None:
                raise RuntimeError("the event could not be read")
            for item in items:
                await self.deliver([item] if isinstance(item, Reply) else await self.bot.handle(item))
        except Exception:
            log.exception("slack: handling event %s failed", origin.event_id)
            if origin.awaits_answer:
                await self.deliver([origin.notice(APOLOGY)])
        if self._durable:
            await self.bot.finished(origin.event_id)

    async def deliver(self, replies: Sequence[Reply]) -> None:
        """Post each reply, as mrkdwn in ordered chunks, where its `reply_to` says
        (adapters/slack/send.py), each person's in order (Lanes.deliver).
        Also the way in for proactive messages and the outbox's retries."""
        await self._lanes.deliver(replies, self.sender.send, self.bot.report_delivery if self._durable else None)
