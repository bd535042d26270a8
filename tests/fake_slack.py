"""A local fake of the Slack Web API (and of Socket Mode) for the test suite.

Test tool only, never part of the product. An aiohttp server on 127.0.0.1 (a free
port) running in its own thread and event loop, so tests on any loop, or none,
can use it. Point the code under test at it with ``SLACK_API_URL=fake.api_url``
(``AsyncWebClient(base_url=fake.api_url)``).

Usage::

    with FakeSlack() as slack:
        slack.add_user("U1", "Alice")
        ...  # run the adapter against slack.api_url
        [post] = await slack.wait_for("chat.postMessage")
        assert post.args["channel"] == "D1"

What it answers (``POST`` or ``GET`` ``/api/<method>``, arguments read from the query
string, a form or a JSON body, the bot token required as ``Authorization: Bearer``):
``auth.test``, ``chat.postMessage``, ``chat.postEphemeral``, ``conversations.open``,
``conversations.info``, ``conversations.history`` and ``conversations.replies`` (honouring
``limit``, ``latest`` and ``inclusive``; messages added with ``add_message`` or posted by
the bot), ``users.info``, ``files.info`` and ``apps.connections.open``
(with the app token; answers a ``ws://`` URL to this server's Socket Mode endpoint).
Anything else is ``{"ok": false, "error": "unknown_method"}``.

Besides the API:

- ``GET /files/<id>/<name>``: the bytes of a file added with ``add_file`` (whose
  ``url_private_download`` points here); the bot token is required, as on Slack.
- ``POST /respond/<tag>``: a ``response_url`` (``slack.response_url("tag")``) for slash
  commands and buttons; recorded as method ``"response_url"``.
- Socket Mode: ``slack.send_socket_event(payload)`` pushes an envelope to the connected
  client; its acks are recorded as method ``"socket_mode.ack"`` (and the connection
  itself as ``"socket_mode.connect"``).

``signature_headers(body, secret)`` signs a payload the way Slack does, for posting
Events API, slash-command and interactive payloads to an app in HTTP mode.

Every request is recorded as a ``SlackCall`` (method, path, parsed args, headers, raw
body). Faults: ``slack.fail("chat.postMessage", "channel_not_found")`` answers the next
call(s) with ``{"ok": false, "error": ...}``; ``slack.rate_limit(method, retry_after=0)``
with HTTP 429, ``Retry-After`` and ``"ratelimited"``; both also apply to
``"file_download"`` and ``"response_url"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import WSMsgType, web

from tests.secrets_catalog import FAKE_SLACK_APP_TOKEN, FAKE_SLACK_BOT_TOKEN

__all__ = ["Failure", "FakeSlack", "SlackCall", "signature_headers"]

JSONDict = dict[str, Any]


def signature_headers(body: str, secret: str, *, timestamp: int | None = None) -> dict[str, str]:
    """The headers Slack signs an HTTP request with: `v0=` + HMAC-SHA256(secret, `v0:TS:BODY`)."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}


@dataclass(frozen=True)
class SlackCall:
    """One request the fake received."""

    method: str  # API method, or "file_download", "response_url", "socket_mode.connect", "socket_mode.ack"
    path: str
    args: JSONDict  # query string, form fields and JSON body merged
    headers: dict[str, str]
    raw_body: bytes
    received_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Failure:
    """What the next call of a method is answered with instead of success."""

    error: str
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


class FakeSlack:
    """A scriptable Slack Web API on 127.0.0.1, served from a daemon thread."""

    def __init__(
        self,
        *,
        bot_token: str = FAKE_SLACK_BOT_TOKEN,
        app_token: str = FAKE_SLACK_APP_TOKEN,
        team_id: str = "T1",
        team_name: str = "Test Team",
        bot_user_id: str = "UBOT",
        bot_id: str = "BBOT",
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.team_id = team_id
        self.team_name = team_name
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._calls: list[SlackCall] = []
        self._failures: dict[str, deque[Failure]] = defaultdict(deque)
        self._users: dict[str, JSONDict] = {}
        self._channels: dict[str, JSONDict] = {}
        self._files: dict[str, tuple[JSONDict, bytes]] = {}
        self._ts = itertools.count(1)
        self._history: dict[str, list[JSONDict]] = defaultdict(list)  # channel -> posted messages, oldest first
        self._sockets: set[web.WebSocketResponse] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._port = 0

    # -- lifecycle --------------------------------------------------------------
    def start(self) -> FakeSlack:
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as error:  # surfaced to start()'s caller
                failure.append(error)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="fake-slack", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise RuntimeError("FakeSlack could not start") from failure[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> FakeSlack:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/files/{file_id}/{name}", self._download)
        app.router.add_post("/respond/{tag}", self._response_url)
        app.router.add_get("/socket-mode", self._socket_mode)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = int(self._runner.addresses[0][1])

    async def _shutdown(self) -> None:
        for socket in list(self._sockets):
            with contextlib.suppress(Exception):
                await socket.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- addresses ------------------------------------------------------------------
    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("FakeSlack is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """The Web API base URL (``SLACK_API_URL`` / ``AsyncWebClient(base_url=...)``)."""
        return f"{self.url}/api/"

    def response_url(self, tag: str = "default") -> str:
        return f"{self.url}/respond/{tag}"

    # -- test data ---------------------------------------------------------------------
    def add_user(
        self,
        user_id: str,
        display_name: str,
        *,
        team_id: str | None = None,
        real_name: str | None = None,
        is_bot: bool = False,
    ) -> JSONDict:
        """A user for users.info; returns the user object Slack would send."""
        user = {
            "id": user_id,
            "team_id": team_id or self.team_id,
            "name": display_name.lower().replace(" ", "."),
            "real_name": real_name or display_name,
            "is_bot": is_bot,
            "profile": {"display_name": display_name, "real_name": real_name or display_name},
        }
        with self._lock:
            self._users[user_id] = user
        return user

    def add_channel(self, channel_id: str, name: str, *, private: bool = False, mpim: bool = False) -> None:
        """A channel for conversations.info: public, private, or a group DM (`mpim`)."""
        with self._lock:
            self._channels[channel_id] = {
                "id": channel_id,
                "name": name,
                "is_channel": not (private or mpim),
                "is_group": private,
                "is_mpim": mpim,
                "is_im": False,
                "is_private": private or mpim,
            }

    def add_message(self, channel: str, user: str, text: str, *, thread_ts: str = "", **extra: Any) -> JSONDict:
        """A message someone posted earlier (conversations.history / .replies list it); returns it."""
        with self._lock:
            message: JSONDict = {"type": "message", "user": user, "text": text, "ts": self._next_ts(), **extra}
            if thread_ts:
                message["thread_ts"] = thread_ts
            self._history[channel].append(message)
        return dict(message)

    def add_file(
        self,
        name: str,
        content: bytes | str,
        *,
        mimetype: str = "text/plain",
        filetype: str = "text",
        file_id: str | None = None,
    ) -> JSONDict:
        """A file served by this fake; returns the file object of a file_share event."""
        data = content.encode() if isinstance(content, str) else content
        file_id = file_id or f"F{uuid.uuid4().hex[:10].upper()}"
        url = f"{self.url}/files/{file_id}/{name}"
        info = {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "filetype": filetype,
            "size": len(data),
            "url_private": url,
            "url_private_download": url,
            "mode": "hosted",
        }
        with self._lock:
            self._files[file_id] = (info, data)
        return dict(info)

    # -- faults -------------------------------------------------------------------------
    def fail(
        self,
        method: str,
        error: str = "internal_error",
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` calls of `method` with an error."""
        with self._lock:
            self._failures[method].extend([Failure(error, status, dict(headers or {}))] * times)

    def rate_limit(self, method: str, *, retry_after: int = 0, times: int = 1) -> None:
        """HTTP 429 with Retry-After, as Slack rate-limits chat.postMessage per channel."""
        self.fail(method, "ratelimited", status=429, headers={"Retry-After": str(retry_after)}, times=times)

    # -- what was received ---------------------------------------------------------------
    @property
    def calls(self) -> list[SlackCall]:
        with self._lock:
            return list(self._calls)

    def calls_to(self, method: str) -> list[SlackCall]:
        with self._lock:
            return [call for call in self._calls if call.method == method]

    def messages_in(self, channel: str) -> list[JSONDict]:
        """What chat.postMessage actually posted to `channel` (failed calls excluded), oldest first."""
        with self._lock:
            return [dict(message) for message in self._history.get(channel, [])]

    def posted_texts(self) -> list[str]:
        """The texts of every chat.postMessage, in order."""
        return [str(call.args.get("text", "")) for call in self.calls_to("chat.postMessage")]

    async def wait_for(self, method: str, count: int = 1, within: float = 10.0) -> list[SlackCall]:
        """Poll (every 20 ms, up to `within` s) until `method` was called `count` times; those calls."""
        deadline = time.monotonic() + within
        while True:
            calls = self.calls_to(method)
            if len(calls) >= count:
                return calls
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{method} was called {len(calls)} times, expected {count} within {within} s; "
                    f"calls so far: {[call.method for call in self.calls]}"
                )
            await asyncio.sleep(0.02)

    def wait_for_blocking(self, method: str, count: int = 1, within: float = 10.0) -> list[SlackCall]:
        """`wait_for` for code without an event loop."""
        with self._changed:
            if not self._changed.wait_for(lambda: sum(c.method == method for c in self._calls) >= count, within):
                raise AssertionError(f"{method} was not called {count} times within {within} s")
            return [call for call in self._calls if call.method == method]

    def reset(self) -> None:
        """Forget calls and pending faults (users, channels and files stay)."""
        with self._lock:
            self._calls.clear()
            self._failures.clear()

    # -- Socket Mode ------------------------------------------------------------------------
    @property
    def socket_connected(self) -> bool:
        with self._lock:
            return bool(self._sockets)

    def send_socket_event(
        self,
        payload: JSONDict,
        *,
        envelope_type: str = "events_api",
        retry_attempt: int = 0,
        retry_reason: str = "",
    ) -> str:
        """Push one envelope to every connected Socket Mode client; its envelope_id."""
        loop = self._loop
        if loop is None or not self.socket_connected:
            raise RuntimeError("no Socket Mode client is connected")
        envelope_id = uuid.uuid4().hex
        envelope = {
            "envelope_id": envelope_id,
            "type": envelope_type,
            "payload": payload,
            "accepts_response_payload": envelope_type != "events_api",
            "retry_attempt": retry_attempt,
            "retry_reason": retry_reason,
        }

        async def send() -> None:
            for socket in list(self._sockets):
                await socket.send_str(json.dumps(envelope))

        asyncio.run_coroutine_threadsafe(send(), loop).result(5)
        return envelope_id

    def ask_to_reconnect(self) -> None:
        """Slack's `disconnect` message (refresh_requested) to every Socket Mode client: it
        opens a new connection (apps.connections.open) and drops the old one."""
        self._to_sockets({"type": "disconnect", "reason": "refresh_requested", "debug_info": {"host": "fake-slack"}})

    def cut_sockets(self) -> None:
        """Close every Socket Mode connection without a goodbye: clients reconnect."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the fake is not running")

        async def cut() -> None:
            for socket in list(self._sockets):
                await socket.close(code=1011, message=b"fake-slack: connection cut")

        asyncio.run_coroutine_threadsafe(cut(), loop).result(5)

    def _to_sockets(self, message: JSONDict) -> None:
        loop = self._loop
        if loop is None or not self.socket_connected:
            raise RuntimeError("no Socket Mode client is connected")

        async def send() -> None:
            for socket in list(self._sockets):
                await socket.send_str(json.dumps(message))

        asyncio.run_coroutine_threadsafe(send(), loop).result(5)

    # -- request handlers ---------------------------------------------------------------------
    def _record(self, method: str, request: web.Request, args: JSONDict, raw: bytes) -> Failure | None:
        call = SlackCall(method=method, path=request.path_qs, args=args, headers=dict(request.headers), raw_body=raw)
        with self._changed:
            self._calls.append(call)
            self._changed.notify_all()
            queue = self._failures.get(method)
            return queue.popleft() if queue else None

    @staticmethod
    async def _args(request: web.Request) -> tuple[JSONDict, bytes]:
        raw = await request.read()
        args: JSONDict = dict(request.query)
        if request.content_type == "application/json" and raw:
            args.update(json.loads(raw))
        elif request.content_type == "application/x-www-form-urlencoded" and raw:
            args.update(parse_qsl(raw.decode(), keep_blank_values=True))
        return args, raw

    @staticmethod
    def _failure_response(failure: Failure) -> web.Response:
        return web.json_response({"ok": False, "error": failure.error}, status=failure.status, headers=failure.headers)

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args, raw = await self._args(request)
        failure = self._record(method, request, args, raw)
        if failure is not None:
            return self._failure_response(failure)
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        authorization = request.headers.get("Authorization", "")
        if not authorization:
            return web.json_response({"ok": False, "error": "not_authed"})
        if authorization != f"Bearer {expected}":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        handler: Callable[[JSONDict], JSONDict] | None = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        with self._lock:
            body = handler(args)
        return web.json_response(body, headers={"x-oauth-scopes": "chat:write,im:history,users:read,files:read"})

    async def _download(self, request: web.Request) -> web.StreamResponse:
        failure = self._record("file_download", request, {"file_id": request.match_info["file_id"]}, b"")
        if failure is not None:
            return self._failure_response(failure)
        if request.headers.get("Authorization") != f"Bearer {self.bot_token}":
            # What Slack does without a valid token: its sign-in page, not the file.
            return web.Response(text="<html>Sign in to Slack</html>", content_type="text/html")
        with self._lock:
            found = self._files.get(request.match_info["file_id"])
        if found is None:
            return web.Response(status=404, text="file not found")
        info, data = found
        return web.Response(body=data, content_type=str(info["mimetype"]))

    async def _response_url(self, request: web.Request) -> web.Response:
        args, raw = await self._args(request)
        args["tag"] = request.match_info["tag"]
        failure = self._record("response_url", request, args, raw)
        if failure is not None:
            return self._failure_response(failure)
        return web.Response(text="ok")

    async def _socket_mode(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(autoping=True, timeout=1.0)  # a short close handshake at stop()
        await socket.prepare(request)
        self._record("socket_mode.connect", request, dict(request.query), b"")
        with self._lock:
            self._sockets.add(socket)
        try:
            await socket.send_str(
                json.dumps(
                    {
                        "type": "hello",
                        "num_connections": 1,
                        "connection_info": {"app_id": "A1"},
                        "debug_info": {"host": "fake-slack"},
                    }
                )
            )
            async for message in socket:
                if message.type == WSMsgType.TEXT:
                    self._record("socket_mode.ack", request, json.loads(message.data), message.data.encode())
        finally:
            with self._lock:
                self._sockets.discard(socket)
        return socket

    # -- the API methods (called with the lock held) ----------------------------------------------
    def _m_auth_test(self, args: JSONDict) -> JSONDict:
        return {
            "ok": True,
            "url": "https://test-team.slack.com/",
            "team": self.team_name,
            "user": "memgpt",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _next_ts(self) -> str:
        return f"{int(time.time())}.{next(self._ts):06d}"

    def _m_chat_postMessage(self, args: JSONDict) -> JSONDict:
        if not args.get("channel"):
            return {"ok": False, "error": "channel_not_found"}
        if not args.get("text") and not args.get("blocks"):
            return {"ok": False, "error": "no_text"}
        ts = self._next_ts()
        message = {
            "type": "message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "text": args.get("text", ""),
            "ts": ts,
        }
        if args.get("thread_ts"):
            message["thread_ts"] = args["thread_ts"]
        metadata = args.get("metadata")
        if isinstance(metadata, str):  # form-encoded calls send it as JSON text
            metadata = json.loads(metadata)
        if metadata:
            message["metadata"] = metadata
        self._history[str(args["channel"])].append(message)
        return {"ok": True, "channel": args["channel"], "ts": ts, "message": message}

    def _m_conversations_history(self, args: JSONDict) -> JSONDict:
        # Newest first, top-level messages only, metadata only when asked for (as Slack does).
        channel = self._history.get(str(args.get("channel")), [])
        return self._listing([m for m in channel if m.get("thread_ts") in (None, m["ts"])], args)

    def _m_conversations_replies(self, args: JSONDict) -> JSONDict:
        thread = str(args.get("ts"))
        found = [m for m in self._history.get(str(args.get("channel")), []) if thread in (m.get("thread_ts"), m["ts"])]
        return self._listing(found, args, newest_first=False)

    @staticmethod
    def _listing(messages: list[JSONDict], args: JSONDict, *, newest_first: bool = True) -> JSONDict:
        limit = int(args.get("limit") or 100)
        if args.get("latest"):  # only messages before it (or at it, with inclusive)
            latest, inclusive = float(args["latest"]), str(args.get("inclusive", "")).lower() in ("1", "true")
            messages = [m for m in messages if float(m["ts"]) < latest or (inclusive and float(m["ts"]) == latest)]
        with_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
        chosen = list(reversed(messages))[:limit] if newest_first else messages[:limit]
        shown = [m if with_metadata else {k: v for k, v in m.items() if k != "metadata"} for m in chosen]
        return {"ok": True, "messages": shown, "has_more": len(messages) > limit}

    def _m_chat_postEphemeral(self, args: JSONDict) -> JSONDict:
        if not args.get("channel") or not args.get("user"):
            return {"ok": False, "error": "channel_not_found" if not args.get("channel") else "user_not_in_channel"}
        return {"ok": True, "message_ts": self._next_ts()}

    def _m_conversations_open(self, args: JSONDict) -> JSONDict:
        users = str(args.get("users") or "")
        if not users:
            return {"ok": False, "error": "users_list_not_supplied"}
        return {"ok": True, "channel": {"id": "D" + users.split(",")[0], "is_im": True}}

    def _m_conversations_info(self, args: JSONDict) -> JSONDict:
        channel = self._channels.get(str(args.get("channel")))
        return {"ok": True, "channel": channel} if channel else {"ok": False, "error": "channel_not_found"}

    def _m_users_info(self, args: JSONDict) -> JSONDict:
        user = self._users.get(str(args.get("user")))
        return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}

    def _m_files_info(self, args: JSONDict) -> JSONDict:
        found = self._files.get(str(args.get("file")))
        return {"ok": True, "file": dict(found[0])} if found else {"ok": False, "error": "file_not_found"}

    def _m_apps_connections_open(self, args: JSONDict) -> JSONDict:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket-mode?ticket={uuid.uuid4().hex}"}
