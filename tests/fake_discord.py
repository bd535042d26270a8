"""A local stand-in for Discord's servers: the REST API (v10) and the gateway.

Test tool only, never part of the product. An aiohttp server on 127.0.0.1 (a free
port) in its own thread and event loop, like tests/fake_slack.py, so a bot on any
loop, or in another process, can use it. Point discord.py at it with
``DISCORD_API_URL=fake.api_url`` and ``DISCORD_GATEWAY_URL=fake.gateway_url``.

It speaks what discord.py 2.7 sends and expects (read from its gateway.py, http.py
and state.py):

- the gateway at ``/gateway`` (``?v=10&encoding=json&compress=zlib-stream``): every
  frame from the server is one zlib stream per connection, each message ending in a
  Z_SYNC_FLUSH; HELLO (op 10), then IDENTIFY (op 2; a wrong token closes with 4004)
  answered with READY (the guild unavailable, as Discord does) and GUILD_CREATE (a
  public channel, a private one that @everyone may not view, a thread, the members);
  heartbeats (op 1) are ACKed (op 11); RESUME (op 6) replays what the session missed
  and sends RESUMED, or invalid session (op 9) when the session is unknown. The test
  can ask a client to reconnect (op 7), invalidate its session, or cut the socket.
- REST: ``GET /users/@me``, ``GET /oauth2/applications/@me``, ``GET /gateway``,
  ``GET /gateway/bot``, ``GET /users/{id}``,
  ``POST /users/@me/channels`` (a DM channel), ``GET /guilds/{id}``,
  ``GET/POST /channels/{id}/messages`` (history with ``limit``/``before``/``after``;
  a send honours ``nonce`` with ``enforce_nonce``), ``GET /channels/{id}/messages/{id}``,
  ``POST /channels/{id}/typing``, ``PUT /applications/{app}/commands`` and its guild
  form, ``POST /interactions/{id}/{token}/callback`` and the follow-up webhooks.
  The bot token is required as ``Authorization: Bot <token>`` (401 otherwise).
  Anything else is 404 with Discord's ``{"code": 0, "message": "404: Not Found"}``.

A message the bot posts is also dispatched to the gateway (MESSAGE_CREATE), as
Discord does, so the bot sees its own messages and must ignore them.

Faults: ``down(api=True, gateway=True)`` until ``up()``: every connection is cut
before an answer (a network outage; ``answer=502`` answers Cloudflare's 502 instead,
which discord.py retries five times, about 25 s, before giving up).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from aiohttp import WSMsgType, web

__all__ = ["DiscordCall", "FakeDiscord"]

JSONDict = dict[str, Any]
DISCORD_EPOCH_MS = 1_420_070_400_000
VIEW_CHANNEL = 1 << 10
# View, send, read history, use commands, send in threads.
EVERYONE_PERMISSIONS = (1 << 10) | (1 << 11) | (1 << 16) | (1 << 31) | (1 << 38)
BOT_TOKEN = "fake-discord-bot-token.Gx1.stand-in-value-0123456789"


@dataclass(frozen=True)
class DiscordCall:
    """One REST request the stand-in received."""

    method: str
    path: str  # without the API prefix: /channels/1/messages
    query: dict[str, str]
    body: Any  # parsed JSON, or None
    headers: dict[str, str]


@dataclass
class _Session:
    session_id: str
    seq: int = 0
    sent: list[tuple[int, JSONDict]] = field(default_factory=list)  # (seq, frame) for RESUME


@dataclass
class _Connection:
    socket: web.WebSocketResponse
    compressor: Any = field(default_factory=zlib.compressobj)
    session: _Session | None = None
    shard: tuple[int, int] = (0, 1)


class FakeDiscord:
    """Discord's REST API and gateway on a local port; `with FakeDiscord() as discord: ...`."""

    def __init__(self, *, token: str = BOT_TOKEN, heartbeat_interval_ms: int = 41_250) -> None:
        self.token = token
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._ids = itertools.count(1)
        self.bot_user = self._user(self.snowflake(), "MemBot", bot=True)
        self.application_id = self.bot_user["id"]
        self.users: dict[str, JSONDict] = {self.bot_user["id"]: self.bot_user}
        self.guild_id = self.snowflake()
        self.guild_ids = [self.guild_id]  # the first, then any added with add_guild
        self.channels: dict[str, JSONDict] = {}
        self.messages: dict[str, list[JSONDict]] = {}
        self.calls: list[DiscordCall] = []
        self.frames_received: list[JSONDict] = []  # every gateway payload a client sent
        self.identifies = 0
        self.resumes = 0
        self.api_down = False
        self.gateway_down = False
        self.down_answer: int | None = None  # None: cut the connection
        self.gateway_bot_url: str | None = None  # what GET /gateway/bot names (None: this gateway)
        self.interaction_callbacks: list[JSONDict] = []
        self._sessions: dict[str, _Session] = {}
        self._connections: list[_Connection] = []
        self._nonces: dict[tuple[str, str], JSONDict] = {}
        self._interaction_channels: dict[str, str] = {}  # interaction token -> where it happened
        self._changed = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self.public_channel = self._add_channel("general")
        self.private_channel = self._add_channel("team", private=True)
        self.thread = self._add_thread(self.public_channel["id"], "plans")
        self.system_channel_id = self.public_channel["id"]

    # -- the world -------------------------------------------------------------
    def snowflake(self) -> str:
        """A time-ordered id, like Discord's (milliseconds since 2015 in the high bits)."""
        return str(((int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22) | (next(self._ids) & 0x3FFFFF))

    @staticmethod
    def _user(user_id: str, name: str, *, bot: bool = False) -> JSONDict:
        user = {"id": user_id, "username": name.lower(), "global_name": name, "discriminator": "0", "avatar": None}
        return user | ({"bot": True} if bot else {})

    def add_user(self, name: str, *, in_private_channel: bool = False) -> JSONDict:
        """A person in the server (and, if asked, a member of the private channel)."""
        user = self._user(self.snowflake(), name)
        self.users[user["id"]] = user
        if in_private_channel:
            self._allow(self.private_channel, user["id"])
        return user

    def add_guild(self) -> str:
        """Another server the bot is in (call before the bot connects), with everyone in it; its id."""
        guild_id = self.snowflake()
        self.guild_ids.append(guild_id)
        return guild_id

    def add_channel(self, name: str, *, guild_id: str | None = None) -> JSONDict:
        """Another public text channel (call before the bot connects), in `guild_id` or the first server."""
        return self._add_channel(name, guild_id=guild_id)

    def _add_channel(self, name: str, *, private: bool = False, guild_id: str | None = None) -> JSONDict:
        channel_id = self.snowflake()
        overwrites = []
        if private:  # @everyone (the role whose id is the guild's) may not view it; the bot may
            overwrites = [
                {"id": self.guild_id, "type": 0, "allow": "0", "deny": str(VIEW_CHANNEL)},
                {"id": self.bot_user["id"], "type": 1, "allow": str(VIEW_CHANNEL), "deny": "0"},
            ]
        channel = {
            "id": channel_id,
            "type": 0,
            "guild_id": guild_id or self.guild_id,
            "name": name,
            "position": len(self.channels),
            "permission_overwrites": overwrites,
            "parent_id": None,
            "topic": None,
            "nsfw": False,
            "last_message_id": None,
            "rate_limit_per_user": 0,
        }
        self.channels[channel_id] = channel
        self.messages[channel_id] = []
        return channel

    def _allow(self, channel: JSONDict, user_id: str) -> None:
        channel["permission_overwrites"].append({"id": user_id, "type": 1, "allow": str(VIEW_CHANNEL), "deny": "0"})

    def _add_thread(self, parent_id: str, name: str) -> JSONDict:
        thread_id = self.snowflake()
        thread = {
            "id": thread_id,
            "type": 11,  # a public thread
            "guild_id": self.guild_id,
            "parent_id": parent_id,
            "name": name,
            "owner_id": self.bot_user["id"],
            "last_message_id": None,
            "message_count": 0,
            "member_count": 1,
            "rate_limit_per_user": 0,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": 1440,
                "archive_timestamp": _now(),
                "locked": False,
            },
        }
        self.channels[thread_id] = thread
        self.messages[thread_id] = []
        return thread

    def _member(self, user: JSONDict) -> JSONDict:
        return {"user": user, "roles": [], "joined_at": _now(), "deaf": False, "mute": False, "flags": 0, "nick": None}

    def guild(self, guild_id: str | None = None) -> JSONDict:
        """The GUILD_CREATE payload (also GET /guilds/{id}) of a server (the first by default)."""
        guild_id = guild_id or self.guild_id
        guild_channels = [c for c in self.channels.values() if c.get("guild_id") == guild_id and c["type"] != 11]
        threads = [c for c in self.channels.values() if c.get("guild_id") == guild_id and c["type"] == 11]
        return {
            "id": guild_id,
            "name": "Test Server",
            "icon": None,
            "owner_id": next(iter(u["id"] for u in self.users.values() if not u.get("bot")), self.bot_user["id"]),
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "preferred_locale": "en-US",
            "features": [],
            "emojis": [],
            "stickers": [],
            "roles": [
                {
                    "id": guild_id,
                    "name": "@everyone",
                    "permissions": str(EVERYONE_PERMISSIONS),
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                    "flags": 0,
                }
            ],
            "members": [self._member(user) for user in self.users.values()],
            "member_count": len(self.users),
            "channels": guild_channels,
            "threads": threads,
            "large": False,
            "unavailable": False,
            "system_channel_id": self.system_channel_id if guild_id == self.guild_id else None,
            "system_channel_flags": 0,
            "joined_at": _now(),
            "voice_states": [],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
        }

    def dm_channel_of(self, user_id: str) -> JSONDict:
        """The DM channel between the bot and `user_id` (created on first use, like POST /users/@me/channels)."""
        for channel in self.channels.values():
            if channel["type"] == 1 and channel["recipients"][0]["id"] == user_id:
                return channel
        channel = {"id": self.snowflake(), "type": 1, "recipients": [self.users[user_id]], "last_message_id": None}
        self.channels[channel["id"]] = channel
        self.messages[channel["id"]] = []
        return channel

    # -- what people do ------------------------------------------------------
    def dm(self, user: JSONDict, text: str) -> JSONDict:
        """`user` writes to the bot in their DMs: the message, dispatched as MESSAGE_CREATE."""
        return self.post(self.dm_channel_of(user["id"])["id"], user, text)

    def mention(self, channel: JSONDict, user: JSONDict, text: str) -> JSONDict:
        """`user` writes `@MemBot text` in a server channel or thread."""
        return self.post(channel["id"], user, f"<@{self.bot_user['id']}> {text}", mentions=[self.bot_user])

    def post(self, channel_id: str, user: JSONDict, text: str, *, mentions: list[JSONDict] | None = None) -> JSONDict:
        """A message by `user` in a channel, stored and dispatched to every connected client."""
        message = self._message(channel_id, user, text, mentions=mentions or [])
        self._store(message)
        self.dispatch("MESSAGE_CREATE", message)
        return message

    def redeliver(self, message: JSONDict) -> None:
        """Dispatch a message again (a gateway that sends an event twice)."""
        self.dispatch("MESSAGE_CREATE", message)

    def slash_command(
        self, user: JSONDict, name: str, channel: JSONDict | None = None, *, permissions: int = 0, **options: Any
    ) -> JSONDict:
        """`user` runs `/name` (in `channel`, else their DMs): INTERACTION_CREATE. In a server,
        `permissions` are theirs in that channel (e.g. 1 << 4, Manage Channels)."""
        data = {
            "id": self.snowflake(),
            "name": name,
            "type": 1,
            "options": [{"name": k, "type": 3, "value": v} for k, v in options.items()],
        }
        return self._interact(user, 2, data, channel or self.dm_channel_of(user["id"]), permissions)

    def press(self, user: JSONDict, message: JSONDict, label: str) -> JSONDict:
        """`user` presses the button labelled `label` under `message` (a follow-up the bot sent
        them, as `followups()` lists it): a component INTERACTION_CREATE."""
        buttons = {b["label"]: b["custom_id"] for row in message.get("components") or [] for b in row["components"]}
        data = {"custom_id": buttons[label], "component_type": 2}
        return self._interact(user, 3, data, self.channels[message["channel_id"]], 0, message)

    def _interact(
        self,
        user: JSONDict,
        kind: int,
        data: JSONDict,
        channel: JSONDict,
        permissions: int,
        message: JSONDict | None = None,
    ) -> JSONDict:
        interaction: JSONDict = {
            "id": self.snowflake(),
            "application_id": self.application_id,
            "type": kind,
            "data": data,
            "channel_id": channel["id"],
            "channel": channel,
            "token": f"interaction-token-{uuid.uuid4().hex}",
            "version": 1,
            "app_permissions": str(EVERYONE_PERMISSIONS),
            "locale": "en-US",
            "attachment_size_limit": 10 * 1024 * 1024,
            "entitlements": [],
            "authorizing_integration_owners": {"0": channel["guild_id"]}
            if channel.get("guild_id")
            else {"1": user["id"]},
            "context": 0 if channel.get("guild_id") else 1,
        }
        if message is not None:
            interaction["message"] = message
        if channel.get("guild_id"):
            member = self._member(user) | {"permissions": str(permissions)}
            interaction |= {"guild_id": channel["guild_id"], "member": member}
            interaction["guild_locale"] = "en-US"
        else:
            interaction["user"] = user
        self._interaction_channels[interaction["token"]] = channel["id"]
        self.dispatch("INTERACTION_CREATE", interaction)
        return interaction

    def edit(self, message: JSONDict, text: str) -> JSONDict:
        """Its author edits a message: MESSAGE_UPDATE with the whole message, as Discord sends it."""
        edited = message | {"content": text, "edited_timestamp": _now()}
        with self._changed:
            stored = self.messages[message["channel_id"]]
            stored[:] = [edited if m["id"] == message["id"] else m for m in stored]
        self.dispatch("MESSAGE_UPDATE", edited)
        return edited

    def delete(self, message: JSONDict) -> None:
        """A message is deleted: MESSAGE_DELETE (ids only)."""
        with self._changed:
            stored = self.messages[message["channel_id"]]
            stored[:] = [m for m in stored if m["id"] != message["id"]]
        deleted = {"id": message["id"], "channel_id": message["channel_id"]}
        self.dispatch("MESSAGE_DELETE", deleted | ({"guild_id": message["guild_id"]} if "guild_id" in message else {}))

    def followups(self) -> list[JSONDict]:
        """Every follow-up message the bot sent to an interaction, as the stand-in answered it (with its id)."""
        with self._changed:
            return [dict(c["message"]) for c in self.interaction_callbacks if c.get("type") == "followup"]

    def _message(self, channel_id: str, author: JSONDict, text: str, *, mentions: list[JSONDict]) -> JSONDict:
        channel = self.channels[channel_id]
        message: JSONDict = {
            "id": self.snowflake(),
            "channel_id": channel_id,
            "author": author,
            "content": text,
            "timestamp": _now(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": mentions,
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "components": [],
            "pinned": False,
            "type": 0,
            "flags": 0,
        }
        if channel.get("guild_id"):
            member = self._member(author)
            del member["user"]
            message |= {"guild_id": channel["guild_id"], "member": member}
        return message

    def _store(self, message: JSONDict) -> None:
        with self._changed:
            self.messages[message["channel_id"]].append(message)
            self.channels[message["channel_id"]]["last_message_id"] = message["id"]
            self._changed.notify_all()

    # -- reading what the bot did ----------------------------------------------
    def bot_messages(self, channel: JSONDict | str) -> list[JSONDict]:
        channel_id = channel if isinstance(channel, str) else channel["id"]
        with self._changed:
            return [m for m in self.messages.get(channel_id, []) if m["author"]["id"] == self.bot_user["id"]]

    def all_bot_messages(self) -> list[JSONDict]:
        with self._changed:
            return [m for ms in self.messages.values() for m in ms if m["author"]["id"] == self.bot_user["id"]]

    def wait_until(self, condition: Callable[[], bool], within: float = 60.0) -> None:
        """Block until `condition()` holds (checked on every change), or fail after `within` seconds."""
        deadline = time.monotonic() + within
        with self._changed:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the Discord stand-in did not see the condition within {within:.0f} s")
                self._changed.wait(min(left, 0.5))

    def wait_for_bot_messages(self, channel: JSONDict | str, count: int = 1, within: float = 60.0) -> list[JSONDict]:
        self.wait_until(lambda: len(self.bot_messages(channel)) >= count, within)
        return self.bot_messages(channel)

    def calls_to(self, method: str, path_start: str) -> list[DiscordCall]:
        with self._changed:
            return [call for call in self.calls if call.method == method and call.path.startswith(path_start)]

    @property
    def connected(self) -> int:
        """How many gateway sessions are identified or resumed right now."""
        with self._changed:
            return sum(1 for connection in self._connections if connection.session is not None)

    # -- gateway faults --------------------------------------------------------
    def down(self, *, api: bool = True, gateway: bool = True, answer: int | None = None) -> None:
        with self._changed:
            self.api_down, self.gateway_down, self.down_answer = api, gateway, answer
        if gateway:
            self._call_soon(self._cut_all())

    def up(self) -> None:
        with self._changed:
            self.api_down = self.gateway_down = False
            self._changed.notify_all()

    def ask_to_reconnect(self) -> None:
        """op 7 to every client: they reconnect and RESUME."""
        self._call_soon(self._broadcast_op(7, None))

    def invalidate_sessions(self, *, resumable: bool = False) -> None:
        """op 9 to every client: a new IDENTIFY (or, if resumable, a RESUME)."""
        if not resumable:
            with self._changed:
                self._sessions.clear()
        self._call_soon(self._broadcast_op(9, resumable))

    def cut_connections(self) -> None:
        """Close every gateway socket without a goodbye (code 1006-like 4000): clients resume."""
        self._call_soon(self._cut_all())

    def dispatch(self, event: str, data: JSONDict) -> None:
        """A DISPATCH (op 0) to every identified client, with the session's next sequence number."""
        self._call_soon(self._dispatch(event, data))

    def _call_soon(self, coroutine: Any) -> None:
        assert self._loop is not None, "the stand-in is not running"
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _dispatch(self, event: str, data: JSONDict) -> None:
        for connection in list(self._connections):
            session = connection.session
            if session is None:
                continue
            await self._send_dispatch(connection, session, event, data)

    async def _send_dispatch(self, connection: _Connection, session: _Session, event: str, data: JSONDict) -> None:
        session.seq += 1
        frame = {"op": 0, "s": session.seq, "t": event, "d": data}
        session.sent.append((session.seq, frame))
        await self._send(connection, frame)

    async def _broadcast_op(self, op: int, data: Any) -> None:
        for connection in list(self._connections):
            await self._send(connection, {"op": op, "d": data, "s": None, "t": None})

    async def _cut_all(self) -> None:
        for connection in list(self._connections):
            await connection.socket.close(code=4000, message=b"stand-in: connection cut")

    @staticmethod
    async def _send(connection: _Connection, frame: JSONDict) -> None:
        # zlib-stream: one compression context per connection, every message ends in a sync flush.
        compressor = connection.compressor
        data = compressor.compress(json.dumps(frame).encode()) + compressor.flush(zlib.Z_SYNC_FLUSH)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await connection.socket.send_bytes(data)

    # -- the server ------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self._port}/gateway"

    def start(self) -> FakeDiscord:
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self._serve())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-discord", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("the Discord stand-in did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop = None

    def __enter__(self) -> FakeDiscord:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/gateway", self._gateway)
        app.router.add_route("*", "/api/v10/{path:.*}", self._api)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self._port = int(server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    async def _shutdown(self) -> None:
        await self._cut_all()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- gateway -----------------------------------------------------------------
    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if self.gateway_down:
            return self._outage(request)
        if request.query.get("v") != "10" or request.query.get("compress") != "zlib-stream":
            return web.Response(status=400, text="the stand-in speaks v=10 with compress=zlib-stream")
        socket = web.WebSocketResponse(max_msg_size=4096 * 1024)
        await socket.prepare(request)
        connection = _Connection(socket)
        self._connections.append(connection)
        await self._send(connection, {"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval_ms}})
        try:
            async for message in socket:
                if message.type is not WSMsgType.TEXT:
                    continue
                frame = json.loads(message.data)
                with self._changed:
                    self.frames_received.append(frame)
                await self._on_frame(connection, frame)
        finally:
            self._connections.remove(connection)
            with self._changed:
                self._changed.notify_all()
        return socket

    async def _on_frame(self, connection: _Connection, frame: JSONDict) -> None:
        op, data = frame.get("op"), frame.get("d")
        if op == 1:  # heartbeat
            await self._send(connection, {"op": 11, "d": None})
        elif op == 2:  # identify
            if data.get("token") != self.token:
                await connection.socket.close(code=4004, message=b"Authentication failed.")
                return
            shard = tuple(data.get("shard") or (0, 1))
            session = _Session(uuid.uuid4().hex)
            self._sessions[session.session_id] = session
            connection.session, connection.shard = session, (int(shard[0]), int(shard[1]))
            with self._changed:
                self.identifies += 1
                self._changed.notify_all()
            ready = {
                "v": 10,
                "user": self.bot_user,
                "guilds": [{"id": g, "unavailable": True} for g in self.guild_ids] if connection.shard[0] == 0 else [],
                "session_id": session.session_id,
                "resume_gateway_url": self.gateway_url,
                "shard": list(connection.shard),
                "application": {"id": self.application_id, "flags": 0},
                "private_channels": [],
            }
            await self._send_dispatch(connection, session, "READY", ready)
            if connection.shard[0] == 0:
                for guild_id in self.guild_ids:
                    await self._send_dispatch(connection, session, "GUILD_CREATE", self.guild(guild_id))
        elif op == 6:  # resume
            session = self._sessions.get(str(data.get("session_id")))
            if session is None or data.get("token") != self.token:
                await self._send(connection, {"op": 9, "d": False, "s": None, "t": None})
                return
            connection.session = session
            missed = [sent for seq, sent in session.sent if seq > int(data.get("seq") or 0)]
            for sent in missed:
                await self._send(connection, sent)
            with self._changed:  # counted before the client can see RESUMED
                self.resumes += 1
                self._changed.notify_all()
            await self._send_dispatch(connection, session, "RESUMED", {})

    # -- REST ----------------------------------------------------------------------
    async def _api(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["path"]
        raw = await request.read()
        body: Any = None
        if raw and request.content_type == "application/json":
            body = json.loads(raw)
        call = DiscordCall(request.method, path, dict(request.query), body, dict(request.headers))
        with self._changed:
            self.calls.append(call)
            self._changed.notify_all()
        if self.api_down:
            return self._outage(request)
        if not path.startswith(("/interactions/", "/webhooks/")) and request.headers.get("Authorization") != (
            f"Bot {self.token}"
        ):
            return _error(401, 0, "401: Unauthorized")
        for method, pattern, handler in self._routes():
            if method != request.method:
                continue
            parts, wanted = path.strip("/").split("/"), pattern.strip("/").split("/")
            if len(parts) != len(wanted):
                continue
            names = {w[1:-1]: p for w, p in zip(wanted, parts, strict=True) if w.startswith("{")}
            if all(w.startswith("{") or w == p for w, p in zip(wanted, parts, strict=True)):
                return handler(call, **names)
        return _error(404, 0, "404: Not Found")

    def _outage(self, request: web.Request) -> web.Response:
        if self.down_answer is None and request.transport is not None:
            request.transport.abort()  # the client sees the connection drop, no answer
        return web.Response(
            status=self.down_answer or 502, text="<html>502 Bad Gateway</html>", content_type="text/html"
        )

    def _routes(self) -> list[tuple[str, str, Callable[..., web.Response]]]:
        return [
            ("GET", "/users/@me", lambda call: _json(self.bot_user)),
            ("GET", "/oauth2/applications/@me", self._r_application),
            ("GET", "/gateway", lambda call: _json({"url": self.gateway_url})),
            ("GET", "/gateway/bot", self._r_gateway_bot),
            ("GET", "/users/{user}", self._r_user),
            ("POST", "/users/@me/channels", self._r_open_dm),
            ("GET", "/guilds/{guild}", lambda call, guild: _json(self.guild(guild))),
            ("GET", "/channels/{channel}", self._r_channel),
            ("GET", "/channels/{channel}/messages", self._r_history),
            ("POST", "/channels/{channel}/messages", self._r_send),
            ("GET", "/channels/{channel}/messages/{message}", self._r_message),
            ("POST", "/channels/{channel}/typing", lambda call, channel: web.Response(status=204)),
            ("PUT", "/applications/{app}/commands", self._r_sync),
            ("PUT", "/applications/{app}/guilds/{guild}/commands", self._r_sync_guild),
            ("POST", "/interactions/{interaction}/{token}/callback", self._r_callback),
            ("POST", "/webhooks/{app}/{token}", self._r_followup),
            ("PATCH", "/webhooks/{app}/{token}/messages/@original", self._r_followup_edit),
        ]

    def _r_application(self, call: DiscordCall) -> web.Response:
        owner = next((u for u in self.users.values() if not u.get("bot")), self.bot_user)
        application = {
            "id": self.application_id,
            "name": self.bot_user["global_name"],
            "description": "",
            "icon": None,
            "bot_public": False,
            "bot_require_code_grant": False,
            "owner": owner,
            "verify_key": "0" * 64,
            "flags": 0,
            "team": None,
        }
        return _json(application)

    def _r_gateway_bot(self, call: DiscordCall) -> web.Response:
        limit = {"total": 1000, "remaining": 999, "reset_after": 14_400_000, "max_concurrency": 1}
        return _json({"url": self.gateway_bot_url or self.gateway_url, "shards": 1, "session_start_limit": limit})

    def _r_user(self, call: DiscordCall, user: str) -> web.Response:
        found = self.users.get(user)
        return _json(found) if found else _error(404, 10013, "Unknown User")

    def _r_open_dm(self, call: DiscordCall) -> web.Response:
        recipient = str((call.body or {}).get("recipient_id"))
        if recipient not in self.users:
            return _error(400, 50035, "Invalid Form Body")
        return _json(self.dm_channel_of(recipient))

    def _r_channel(self, call: DiscordCall, channel: str) -> web.Response:
        found = self.channels.get(channel)
        return _json(found) if found else _error(404, 10003, "Unknown Channel")

    def _r_history(self, call: DiscordCall, channel: str) -> web.Response:
        if channel not in self.channels:
            return _error(404, 10003, "Unknown Channel")
        limit = int(call.query.get("limit", "50"))
        listed = list(reversed(self.messages[channel]))  # newest first, as Discord lists them
        if "before" in call.query:
            listed = [m for m in listed if int(m["id"]) < int(call.query["before"])]
        if "after" in call.query:
            listed = [m for m in listed if int(m["id"]) > int(call.query["after"])]
        return _json(listed[:limit])

    def _r_message(self, call: DiscordCall, channel: str, message: str) -> web.Response:
        for found in self.messages.get(channel, []):
            if found["id"] == message:
                return _json(found)
        return _error(404, 10008, "Unknown Message")

    def _r_send(self, call: DiscordCall, channel: str) -> web.Response:
        if channel not in self.channels:
            return _error(404, 10003, "Unknown Channel")
        body = call.body or {}
        nonce = body.get("nonce")
        if nonce is not None and body.get("enforce_nonce"):
            # Discord answers a repeat of a recent nonce with the message it already created.
            earlier = self._nonces.get((channel, str(nonce)))
            if earlier is not None:
                return _json(earlier)
        text = str(body.get("content") or "")
        mentions = [self.users[m[2:-1].lstrip("!")] for m in _mention_tokens(text) if m[2:-1].lstrip("!") in self.users]
        message = self._message(channel, self.bot_user, text, mentions=mentions)
        if nonce is not None:
            message["nonce"] = nonce
            self._nonces[(channel, str(nonce))] = message
        if "message_reference" in body:
            message["message_reference"] = body["message_reference"]
        self._store(message)
        asyncio.get_running_loop().create_task(self._dispatch("MESSAGE_CREATE", message))
        return _json(message)

    def _r_sync(self, call: DiscordCall, app: str) -> web.Response:
        commands = [
            command | {"id": self.snowflake(), "application_id": self.application_id, "version": self.snowflake()}
            for command in (call.body or [])
        ]
        return _json(commands)

    def _r_sync_guild(self, call: DiscordCall, app: str, guild: str) -> web.Response:
        return self._r_sync(call, app)

    def _r_callback(self, call: DiscordCall, interaction: str, token: str) -> web.Response:
        body = call.body or {}
        with self._changed:
            self.interaction_callbacks.append(body)
            self._changed.notify_all()
        data = body.get("data") or {}
        response: JSONDict = {
            "interaction": {
                "id": interaction,
                "type": 2,
                "response_message_loading": body.get("type") == 5,
                "response_message_ephemeral": bool(int(data.get("flags") or 0) & 64),
            }
        }
        return _json(response)

    def _r_followup(self, call: DiscordCall, app: str, token: str) -> web.Response:
        body = call.body or {}
        channel = self._interaction_channels.get(token, next(iter(self.channels)))
        message = self._message(channel, self.bot_user, str(body.get("content") or ""), mentions=[])
        message |= {"flags": int(body.get("flags") or 0), "webhook_id": app, "components": body.get("components") or []}
        with self._changed:
            self.interaction_callbacks.append({"type": "followup", "data": body, "message": message})
            self._changed.notify_all()
        return _json(message)

    def _r_followup_edit(self, call: DiscordCall, app: str, token: str) -> web.Response:
        """An edit of the interaction's first answer (a pressed question's, say): recorded as "edit"."""
        body = call.body or {}
        channel = self._interaction_channels.get(token, next(iter(self.channels)))
        message = self._message(channel, self.bot_user, str(body.get("content") or ""), mentions=[])
        with self._changed:
            self.interaction_callbacks.append({"type": "edit", "data": body, "message": message})
            self._changed.notify_all()
        return _json(message | {"flags": int(body.get("flags") or 0), "webhook_id": app})


def _mention_tokens(text: str) -> list[str]:
    return re.findall(r"<@!?\d+>", text)


def _json(data: Any, status: int = 200) -> web.Response:
    # Exactly "application/json", as Discord sends it: discord.py compares the header
    # whole, so aiohttp's "application/json; charset=utf-8" would be read as text.
    return web.Response(body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json"})


def _error(status: int, code: int, message: str) -> web.Response:
    return _json({"code": code, "message": message}, status=status)


def _now() -> str:
    return datetime.now(UTC).isoformat()
