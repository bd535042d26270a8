"""The Slack adapter: Events API in (Socket Mode or HTTP), chat.postMessage out.

Each Slack payload is read by one small listener that drops what the bot must
not answer, records the event in the bot's journal (bot/durable/) and hands
a builder to `_submit`; the builder turns the payload into typed events
(`UserMessage`, `UserJoined`, `FileUploaded`). Bolt acks an event only once its
listener returns (`process_before_response=True`): an event Slack stops
re-delivering is always one the bot has kept. The listeners only record and
schedule work, so the agent's LLM calls never delay the HTTP response or the
Socket Mode ack. Replies carry their outbox id in message metadata, so a reply
re-sent after a crash is first looked for in the conversation (`_parts_posted`).

Work for one user runs in arrival order (their lane, bot/durable/lanes.py,
taken before any await) so that reading the display name or downloading a
file cannot let a later message overtake an earlier one; different users run
concurrently. Replies keep that order too: while one waits for a retry, the
same person's later replies wait behind it (Lanes.deliver).
Slack's retried deliveries are dropped by Events API `event_id` (the journal's key).

Like every adapter it knows nothing of memory: it calls only the `BotPort`.
Slash commands live in `slack_commands`, configuration and small parts in
`slack_support`, Markdown to mrkdwn in `slack_format`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp, AsyncBoltContext, AsyncBoltRequest
from slack_bolt.middleware.authorization.async_single_team_authorization import AsyncSingleTeamAuthorization
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack_commands import FORGET_CANCEL, FORGET_CONFIRM, add_commands
from adapters.slack_format import markdown_to_mrkdwn, slack_to_plain
from adapters.slack_support import (
    CALL_ERRORS,
    LRU,
    PLATFORM,
    REPLY_LIMIT,
    EventDeduper,
    RecentEventIds,
    SlackConfig,
    SlackSetupError,
    error_code,
    human_size,
    name_of,
    time_of,
)
from adapters.splitting import split_message
from bot.durable.lanes import Lanes
from bot.events import Delivery, Event, FileUploaded, Redo, Reply, UserJoined, UserMessage, agent_key
from bot.ports import BotPort, readable

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
# Slack's `filetype` of the readable kinds, for a file whose name says nothing.
UPLOAD_FILETYPES = {"text": "text/plain", "markdown": "text/markdown", "html": "text/html", "pdf": "application/pdf"}
# Errors that mean the reply can never arrive: the person left, deactivated
# their account, or blocked the bot; the place is gone or closed to it.
GONE = frozenset(
    {
        "channel_not_found",
        "is_archived",
        "not_in_channel",
        "account_inactive",
        "user_not_found",
        "user_disabled",
        "cannot_dm_bot",
        "messages_tab_disabled",
        "restricted_action",
        "user_not_visible",
        "team_access_not_granted",
    }
)
METADATA_TYPE = "memgpt_reply"  # message metadata that names a reply's outbox entry
APOLOGY = "Sorry, something went wrong on my side and I couldn't answer that. Please try again."


@dataclass(slots=True)
class _Person:
    name: str
    is_bot: bool = False


class _Without(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


class SlackClosingError(Exception):
    """An event arrived while the adapter closes: not acknowledged, so Slack delivers it again."""


class _DownloadError(Exception):
    """Why a shared file could not be fetched; the text is shown to nobody but the log."""


def _team_of(body: Mapping[str, Any], event: Mapping[str, Any]) -> str:
    # The user's own team: in shared channels that differs from the workspace receiving the event.
    return str(event.get("user_team") or event.get("team") or body.get("team_id") or "")


@dataclass(slots=True)
class _Origin:
    """Who a payload is from, where answers to it go, and its Events API id."""

    team: str
    user: str
    reply_to: dict[str, Any]
    event_id: str
    created_at: datetime

    @classmethod
    def of(cls, body: Mapping[str, Any], team: str, user: str, reply_to: dict[str, Any], ts: Any) -> _Origin:
        return cls(team, user, reply_to, str(body.get("event_id") or uuid.uuid4().hex), time_of(ts))

    def to_json(self) -> dict[str, Any]:
        return {
            "team": self.team,
            "user": self.user,
            "reply_to": self.reply_to,
            "event_id": self.event_id,
            "created_at": self.created_at.isoformat(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Origin:
        return cls(
            str(data["team"]),
            str(data["user"]),
            dict(data["reply_to"]),
            str(data["event_id"]),
            datetime.fromisoformat(str(data["created_at"])),
        )

    @property
    def user_id(self) -> str:
        return f"{self.team}:{self.user}"

    def fields(self, **extra: Any) -> dict[str, Any]:
        """The arguments every event built from this payload shares."""
        return {
            "platform": PLATFORM,
            "user_id": self.user_id,
            "reply_to": self.reply_to,
            "event_id": self.event_id,
            "created_at": self.created_at,
            "durable": True,
            "journal_id": self.event_id,  # a file's event has its own id, the journal entry is the payload's
            **extra,
        }

    def notice(self, text: str, event_id: str | None = None) -> Reply:
        """A message the adapter sends itself (a refused file, an apology)."""
        return Reply(
            text=text,
            platform=PLATFORM,
            user_id=self.user_id,
            reply_to=self.reply_to,
            event_id=event_id or self.event_id,
        )


Item = Event | Reply  # an event for the bot, or a notice the adapter sends itself
Builder = Callable[[], Awaitable[list[Item]]]


# --------------------------------------------------------------------------- the adapter


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
        self.client = AsyncWebClient(
            token=config.bot_token,
            base_url=config.api_url or AsyncWebClient.BASE_URL,
            # Slack rate-limits chat.postMessage per channel (HTTP 429 + Retry-After): wait and retry.
            retry_handlers=[AsyncConnectionErrorRetryHandler(), AsyncRateLimitErrorRetryHandler(max_retry_count=3)],
        )
        # Bolt warns that SLACK_BOT_TOKEN "will be unused" whenever that variable is set
        # and a client is given, which is how this bot is always run: a false alarm.
        bolt_log, quiet = logging.getLogger("slack_bolt.AsyncApp"), _Without("`token` will be unused")
        bolt_log.addFilter(quiet)
        try:
            self.app = AsyncApp(
                name="memgpt-bot",
                client=self.client,
                signing_secret=config.signing_secret or "",
                request_verification_enabled=not config.socket_mode,
                # The listeners record each event in the bot's journal and return
                # (no LLM work): only then does Bolt acknowledge it, so an event
                # Slack stops retrying is never one the bot did not keep.
                process_before_response=True,
            )
        finally:
            bolt_log.removeFilter(quiet)
        self.app.event("message")(self._on_message)
        self.app.event("app_mention")(self._on_app_mention)
        self.app.event("team_join")(self._on_team_join)
        self.app.event("member_joined_channel")(self._on_member_joined_channel)
        add_commands(self.app, bot)
        self.bot_user_id: str | None = None
        self.team_name: dict[str, str] = {}
        self._people: LRU[str, _Person] = LRU(5_000, ttl=3_600)
        self._channel_names: LRU[str, str] = LRU(2_000, ttl=3_600)
        self._dm_channels: LRU[str, str] = LRU(5_000)
        self._lanes = Lanes()
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None
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
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self.client.session = self._session  # one connection pool for every Web API call
        try:
            await self._connect()
        except BaseException:
            await self._session.close()
            self._session = self.client.session = None
            raise
        self._ready.set()

    async def wait_ready(self) -> None:
        """Return once connected (Socket Mode) or listening (HTTP mode)."""
        await self._ready.wait()

    async def _connect(self) -> None:
        try:
            auth = await self.client.auth_test()
        except SlackApiError as error:
            raise SlackSetupError(f"Slack rejected SLACK_BOT_TOKEN (auth.test: {error_code(error)})") from None
        except (aiohttp.ClientError, TimeoutError) as error:
            raise SlackSetupError(f"cannot reach the Slack Web API: {type(error).__name__}: {error}") from None
        self.bot_user_id = auth.get("user_id")
        if auth.get("team_id") and auth.get("team"):
            self.team_name[str(auth["team_id"])] = str(auth["team"])
        # Bolt's single-workspace authorization calls auth.test itself on the first
        # event, and events that arrive together each wait for their own call and may
        # overtake one another. Handing it this answer keeps even the first burst in order.
        for middleware in getattr(self.app, "_async_middleware_list", []):
            if isinstance(middleware, AsyncSingleTeamAuthorization) and middleware.auth_test_result is None:
                middleware.auth_test_result = auth
        if self.config.socket_mode:
            await self._connect_socket_mode()
        else:
            await self._listen_http()

    async def _connect_socket_mode(self) -> None:
        assert self.config.app_token is not None
        handler = AsyncSocketModeHandler(self.app, self.config.app_token, web_client=self.client)
        # Ask for the WebSocket URL ourselves: the Socket Mode client retries a bad
        # app token forever, while a clear error at start-up is what a person needs.
        try:
            opened = await self.client.apps_connections_open(app_token=self.config.app_token)
        except SlackApiError as error:
            await handler.close_async()  # type: ignore[no-untyped-call]  # slack-sdk leaves it unannotated
            raise SlackSetupError(
                f"Slack rejected SLACK_APP_TOKEN (apps.connections.open: {error_code(error)})"
            ) from None
        handler.client.wss_uri = opened["url"]
        await handler.connect_async()  # type: ignore[no-untyped-call]  # slack-sdk leaves it unannotated
        self._socket = handler
        log.info("slack: connected in Socket Mode")

    async def _listen_http(self) -> None:
        web_app = web.Application()
        web_app.router.add_post(EVENTS_PATH, self._on_http_request)
        runner = web.AppRunner(web_app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.config.http_host, self.config.http_port).start()
        except BaseException:  # e.g. the port is taken
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("slack: listening on http://%s:%s%s", self.config.http_host, self.port, EVENTS_PATH)

    @property
    def port(self) -> int | None:
        """The bound HTTP port in HTTP mode once listening (useful with port 0), else None."""
        if self._runner is None or not self._runner.addresses:
            return None
        return int(self._runner.addresses[0][1])

    async def close(self, grace: float = 10.0) -> None:
        """Stop receiving, give work in flight `grace` seconds to finish, then cancel it."""
        if self._closing:
            return
        self._closing = True
        try:
            if self._socket is not None:
                await self._socket.close_async()  # type: ignore[no-untyped-call]  # slack-sdk leaves it unannotated
            if self._runner is not None:
                await self._runner.cleanup()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.drain()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            if self._session is not None:
                await self._session.close()
            self._closed.set()

    async def drain(self) -> None:
        """Wait until every event taken so far has been answered."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _on_http_request(self, request: web.Request) -> web.Response:
        bolt_response = await self.app.async_dispatch(await to_bolt_request(request))
        return await to_aiohttp_response(bolt_response)

    # -- listeners: filter, then hand a builder on ---------------------------
    def _is_from_a_bot(self, event: Mapping[str, Any], context: AsyncBoltContext) -> bool:
        own = context.bot_user_id or self.bot_user_id
        return bool(event.get("bot_id")) or not event.get("user") or event.get("user") == own

    async def _on_message(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext, request: AsyncBoltRequest
    ) -> None:
        subtype = event.get("subtype")
        if event.get("channel_type") != "im" or subtype not in (None, "file_share"):
            return  # edits, deletions, bot messages, joins...: nothing a person said to the bot
        if self._is_from_a_bot(event, context):
            return
        retry = request.headers.get("x-slack-retry-num", [None])[0]
        if retry and retry != "0":
            log.info(
                "slack: retry %s of event %s (%s)",
                retry,
                body.get("event_id"),
                request.headers.get("x-slack-retry-reason", ["?"])[0],
            )
        reply_to = {"channel": event["channel"]}
        if event.get("thread_ts"):
            reply_to["thread_ts"] = event["thread_ts"]
        origin = _Origin.of(body, _team_of(body, event), str(event["user"]), reply_to, event.get("ts"))
        await self._accept(origin, "file_share" if subtype == "file_share" else "message", event)

    async def _on_app_mention(self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext) -> None:
        if self._is_from_a_bot(event, context):
            return
        # Answer in the mention's thread (or the thread it was posted in), addressed to its author.
        reply_to = {
            "channel": event["channel"],
            "thread_ts": event.get("thread_ts") or event["ts"],
            "mention": event["user"],
        }
        origin = _Origin.of(body, _team_of(body, event), str(event["user"]), reply_to, event.get("ts"))
        await self._accept(origin, "app_mention", event)

    async def _on_team_join(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        person = event.get("user") or {}
        if not isinstance(person, dict) or not person.get("id") or person.get("is_bot"):
            return
        team = str(person.get("team_id") or body.get("team_id") or "")
        origin = _Origin.of(body, team, str(person["id"]), {"dm_user": person["id"]}, body.get("event_time"))
        self._people.put(origin.user_id, _Person(name_of(person) or origin.user))
        await self._accept(origin, "team_join", event)

    async def _on_member_joined_channel(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        if self._is_from_a_bot(event, context):
            return  # the bot itself was added to a channel
        origin = _Origin.of(
            body, _team_of(body, event), str(event["user"]), {"dm_user": event["user"]}, event.get("event_ts")
        )
        await self._accept(origin, "member_joined_channel", event)

    # -- taking an event: journal, then work ------------------------------------
    async def _accept(self, origin: _Origin, kind: str, event: Mapping[str, Any]) -> None:
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
        self._submit(origin, self._builder(kind, origin, event))

    def _builder(self, kind: str, origin: _Origin, event: Mapping[str, Any]) -> Builder:
        """The work of one recorded event, by kind (also how a replay rebuilds it)."""
        if kind == "file_share":
            return lambda: self._file_share(origin, event)
        if kind == "message":
            return lambda: self._user_message(origin, event)

        async def mention() -> list[Item]:
            return await self._user_message(origin, event, channel=await self._channel_name(str(event["channel"])))

        async def team_join() -> list[Item]:
            person = await self._person(origin, (event.get("user") or {}).get("profile"))
            workspace = self.team_name.get(origin.team)
            place = f"the {workspace} Slack workspace" if workspace else "the Slack workspace"
            return [UserJoined(**origin.fields(display_name=person.name, place=place))]

        async def joined_channel() -> list[Item]:
            person = await self._person(origin)
            if person.is_bot:
                return []
            place = await self._channel_name(str(event["channel"]))
            return [UserJoined(**origin.fields(display_name=person.name, place=place))]

        builders = {"app_mention": mention, "team_join": team_join, "member_joined_channel": joined_channel}
        return builders[kind]

    async def recover(self) -> int:
        """Replay the events a crash left unfinished, in arrival order, and
        wait for them; the number replayed. Call once connected, before new work."""
        if not self._durable:
            return 0
        return await self.replay(await self.bot.pending_events(PLATFORM))

    async def replay(self, redos: Sequence[Redo]) -> int:
        """Handle recorded events again, in order (through the users' lanes), and wait for them."""
        for redo in redos:
            origin = _Origin.from_json(redo.payload["origin"])
            if redo.notice:  # given up: the person is told, instead of a redo
                self._submit(origin, self._gave_up(origin, redo.notice))
            else:
                self._submit(origin, self._builder(str(redo.payload["kind"]), origin, redo.payload["event"]))
        await self.drain()
        return len(redos)

    @staticmethod
    def _gave_up(origin: _Origin, notice: str) -> Builder:
        async def build() -> list[Item]:
            # Only someone who wrote waits for an answer (not so after a join).
            return [origin.notice(notice)] if "channel" in origin.reply_to else []

        return build

    # -- builders: payload -> typed events -----------------------------------
    async def _user_message(self, origin: _Origin, event: Mapping[str, Any], *, channel: str = "") -> list[Item]:
        text = str(event.get("text") or "")
        if self.bot_user_id:
            text = re.sub(rf"<@{re.escape(self.bot_user_id)}(?:\|[^>]*)?>", "", text)
        person = await self._person(origin, event.get("user_profile"))
        plain = slack_to_plain(text, self._cached_name(origin.team)).strip()
        return [
            UserMessage(**origin.fields(text=plain or "(an empty message)", display_name=person.name, channel=channel))
        ]

    async def _file_share(self, origin: _Origin, event: Mapping[str, Any]) -> list[Item]:
        person = await self._person(origin, event.get("user_profile"))
        items: list[Item] = []
        for number, shared in enumerate(event.get("files") or []):
            file_event_id = f"{origin.event_id}:{number}"
            try:
                items.append(await self._upload(origin, shared, person.name, file_event_id))
            except _DownloadError as error:
                log.warning("slack: could not download file %s: %s", shared.get("id"), error)
                name = shared.get("name") or "that file"
                items.append(
                    origin.notice(f"I couldn't download {name} from Slack, so I didn't save it.", file_event_id)
                )
        if str(event.get("text") or "").strip():
            items += await self._user_message(origin, event)
        return items

    async def _upload(self, origin: _Origin, shared: Mapping[str, Any], display_name: str, event_id: str) -> Item:
        if shared.get("file_access") == "check_file_info" or not shared.get("url_private_download"):
            try:
                shared = (await self.client.files_info(file=str(shared["id"])))["file"]
            except CALL_ERRORS as error:
                raise _DownloadError(f"files.info failed: {error_code(error)}") from None
        name = str(shared.get("name") or shared.get("title") or shared.get("id") or "file")
        content_type = str(shared.get("mimetype") or UPLOAD_FILETYPES.get(str(shared.get("filetype") or "")) or "")
        if not readable(name, content_type):
            text = f"I can only read text (.txt), Markdown (.md), HTML and PDF files, so I didn't save {name}."
            return origin.notice(text, event_id)
        too_large = origin.notice(
            f"{name} is too large: I can read files of up to {human_size(self.config.max_upload_bytes)}.", event_id
        )
        if int(shared.get("size") or 0) > self.config.max_upload_bytes:
            return too_large
        is_html = content_type == "text/html" or name.lower().endswith((".html", ".htm", ".xhtml"))
        url = str(shared.get("url_private_download") or shared.get("url_private") or "")
        data = await self._download(url, html_expected=is_html)
        if data is None:
            return too_large
        return FileUploaded(
            **origin.fields(
                event_id=event_id, filename=name, data=data, content_type=content_type, display_name=display_name
            )
        )

    def _may_send_token_to(self, url: str) -> bool:
        """The bot token goes only to Slack's own hosts (or the configured API host)."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com")):
            return True
        if self.config.api_url:
            api = urlsplit(self.config.api_url)
            return (parts.scheme, parts.netloc) == (api.scheme, api.netloc)
        return False

    async def _download(self, url: str, *, html_expected: bool = False) -> bytes | None:
        """The file's bytes; None if it is larger than the upload limit."""
        if not self._may_send_token_to(url):
            raise _DownloadError("not a Slack file URL")
        if self._session is None:
            raise _DownloadError("the adapter is not connected")
        limit = self.config.max_upload_bytes
        headers = {"Authorization": f"Bearer {self.config.bot_token}"}
        try:
            async with self._session.get(url, headers=headers) as response:
                if response.status != 200:
                    raise _DownloadError(f"HTTP {response.status}")
                if response.content_type == "text/html" and not html_expected:
                    # Without the files:read scope Slack answers with its sign-in page.
                    raise _DownloadError("Slack sent a web page instead of the file (is files:read granted?)")
                data = bytearray()
                async for chunk in response.content.iter_chunked(64 * 1024):
                    data += chunk
                    if len(data) > limit:  # the announced size may be wrong; never hold more than the limit
                        return None
                return bytes(data)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _DownloadError(type(error).__name__) from None

    # -- running the work ------------------------------------------------------
    def _submit(self, origin: _Origin, build: Builder) -> None:
        if self._closing:
            log.info("slack: closing; dropping event %s", origin.event_id)
            return
        # Our own task (not Bolt's untracked future) so close() can wait for it.
        task = asyncio.create_task(self._process(origin, build), name=f"slack-event-{origin.event_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, origin: _Origin, build: Builder) -> None:
        async with self._lanes.hold(
            agent_key(PLATFORM, origin.user_id)
        ):  # the first await: it fixes this event's place in line
            try:
                for item in await build():
                    await self.deliver([item] if isinstance(item, Reply) else await self.bot.handle(item))
            except Exception:
                log.exception("slack: handling event %s failed", origin.event_id)
                if "channel" in origin.reply_to:  # someone is waiting for an answer (not so after a join)
                    await self.deliver([origin.notice(APOLOGY)])
            if self._durable:
                await self.bot.finished(origin.event_id)

    async def deliver(self, replies: Sequence[Reply]) -> None:
        """Post each reply, as mrkdwn in ordered chunks, where its `reply_to` says:
        `{"channel": C, "thread_ts"?: TS, "mention"?: USER}` or `{"dm_user": USER}`
        (the user's DM, opened on demand), each person's in order (Lanes.deliver).
        Also the way in for proactive messages and the outbox's retries."""
        await self._lanes.deliver(replies, self._send, self.bot.report_delivery if self._durable else None)

    async def _send(self, reply: Reply) -> tuple[Delivery, str]:
        try:
            channel = await self._reply_channel(reply.reply_to)
        except SlackApiError as error:
            code = error_code(error)
            return (Delivery.UNDELIVERABLE if code in GONE else Delivery.RETRY), f"conversations.open: {code}"
        except CALL_ERRORS as error:
            return Delivery.RETRY, f"conversations.open: {error_code(error)}"
        if channel is None:
            return Delivery.UNDELIVERABLE, "nowhere to send it"
        text = markdown_to_mrkdwn(reply.text)
        if reply.reply_to.get("mention"):
            text = f"<@{reply.reply_to['mention']}> {text}"
        thread_ts = reply.reply_to.get("thread_ts")
        # Parts already on Slack, when a crash or an unclear failure came between
        # a send and its confirmation: each part carries its outbox id.
        posted = await self._parts_posted(channel, thread_ts, reply.outbox_id) if reply.resend else set()
        chunks = [chunk for chunk in split_message(text, REPLY_LIMIT) if chunk.strip()]
        for part, chunk in enumerate(chunks):
            if part in posted:
                continue
            metadata = {"event_type": METADATA_TYPE, "event_payload": {"outbox_id": reply.outbox_id, "part": part}}
            extra: dict[str, Any] = {"thread_ts": thread_ts} if thread_ts else {}
            if reply.outbox_id:
                extra["metadata"] = metadata
            try:
                await self.client.chat_postMessage(channel=channel, text=chunk, **extra)
            except CALL_ERRORS as error:
                code = error_code(error)
                log.error("slack: chat.postMessage to %s failed: %s", channel, code)
                # The rest would fail the same way, or arrive out of order.
                return (Delivery.UNDELIVERABLE if code in GONE else Delivery.RETRY), f"chat.postMessage: {code}"
        return Delivery.SENT, ""

    async def _parts_posted(self, channel: str, thread_ts: str | None, outbox_id: str) -> set[int]:
        """Which parts of a reply are already in the conversation (recent history)."""
        try:
            if thread_ts:
                found = await self.client.conversations_replies(
                    channel=channel, ts=thread_ts, include_all_metadata=True, limit=200
                )
            else:
                found = await self.client.conversations_history(channel=channel, include_all_metadata=True, limit=100)
        except CALL_ERRORS as error:
            # Without history access (a scope missing), sending twice beats never sending.
            log.warning(
                "slack: cannot check %s for reply %s before resending it: %s", channel, outbox_id, error_code(error)
            )
            return set()
        parts = set()
        for message in found.get("messages") or []:
            metadata = message.get("metadata") or {}
            payload = metadata.get("event_payload") or {}
            if metadata.get("event_type") == METADATA_TYPE and payload.get("outbox_id") == outbox_id:
                parts.add(int(payload.get("part", 0)))
        return parts

    async def _reply_channel(self, reply_to: Mapping[str, Any]) -> str | None:
        if reply_to.get("channel"):
            return str(reply_to["channel"])
        user = reply_to.get("dm_user")
        if not user:
            log.error("slack: a reply has nowhere to go (%s)", sorted(reply_to))
            return None
        channel = self._dm_channels.get(str(user))
        if channel is None:
            try:
                opened = await self.client.conversations_open(users=str(user))
            except CALL_ERRORS as error:
                log.error("slack: conversations.open with %s failed: %s", user, error_code(error))
                raise
            channel = str(opened["channel"]["id"])
            self._dm_channels.put(str(user), channel)
        return channel

    # -- names -----------------------------------------------------------------
    def _cached_name(self, team: str) -> Callable[[str], str | None]:
        def known_name(user: str) -> str | None:
            person = self._people.get(f"{team}:{user}")
            return person.name if person else None

        return known_name

    async def _person(self, origin: _Origin, profile: Mapping[str, Any] | None = None) -> _Person:
        person = self._people.get(origin.user_id)
        if person is not None:
            return person
        name = name_of({"profile": profile}) if profile else None
        if name is not None:
            person = _Person(name)
        else:
            try:
                info = (await self.client.users_info(user=origin.user))["user"]
            except CALL_ERRORS as error:
                log.warning("slack: users.info for %s failed: %s", origin.user, error_code(error))
                return _Person(origin.user)  # not cached: the next message tries again
            person = _Person(name_of(info) or origin.user, bool(info.get("is_bot")))
        self._people.put(origin.user_id, person)
        return person

    async def _channel_name(self, channel: str) -> str:
        name = self._channel_names.get(channel)
        if name is None:
            try:
                info = (await self.client.conversations_info(channel=channel))["channel"]
                name = f"#{info['name']}" if info.get("name") else channel
            except (*CALL_ERRORS, KeyError) as error:
                log.info("slack: conversations.info for %s failed: %s", channel, error_code(error))
                return f"channel {channel}"
            self._channel_names.put(channel, name)
        return name


__all__ = [
    "APOLOGY",
    "EVENTS_PATH",
    "FORGET_CANCEL",
    "FORGET_CONFIRM",
    "PLATFORM",
    "REPLY_LIMIT",
    "EventDeduper",
    "RecentEventIds",
    "SlackAdapter",
    "SlackConfig",
    "SlackSetupError",
]
