"""A local, scriptable, OpenAI-compatible chat-completions server for the test suite.

Test tool only, never part of the product. Standard library only on the server side.

Usage::

    from tests.fake_llm import fake_llm, reply_text, reply_tool_calls, tool_call

    with fake_llm() as server:
        server.script(
            reply_tool_calls(tool_call("send_message", {"message": "hi"})),
            reply_text("done"),
        )
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
        ...
        assert server.requests[0]["messages"][0]["role"] == "system"

Replies are served from a FIFO queue (``server.script(...)``); when the queue is empty the
optional fallback ``server.set_handler(fn)`` is called with the parsed request body; when
neither yields a reply the server answers a loud HTTP 500 (with ``x-should-retry: false`` so
the openai client does not retry it) saying the script ran out.

A request with ``stream: true`` gets its reply as server-sent events (the usage last, when
``stream_options.include_usage`` asks for it); ``server.streaming = False`` refuses such a
request with 400, as some servers do. ``RunawayReply`` streams until the client closes.

Faults (``fault_status``, ``fault_delay``, ``fault_malformed_json``, ``fault_disconnect``) are
replies too and can be scripted or returned from a handler.

What the real openai client (openai 3.x over httpx2) raises for each fault:

- ``fault_status(429)``                  -> ``openai.RateLimitError`` (retried first)
- ``fault_status(500)`` / ``(503)``      -> ``openai.InternalServerError`` (retried first)
- ``fault_status(400)``                  -> ``openai.BadRequestError`` (not retried)
- ``fault_delay(s)`` with s > timeout    -> ``openai.APITimeoutError`` (retried first)
- ``fault_malformed_json()``             -> ``json.JSONDecodeError`` (a ``ValueError``; NOT an
  ``openai.OpenAIError`` and not retried: the body is parsed after the retry loop)
- ``fault_disconnect()``                 -> ``openai.APIConnectionError`` (retried first)
- ``fault_truncated_body()``             -> ``openai.APIConnectionError`` (retried first): the
  body is shorter than its Content-Length and the connection closes
- ``fault_non_json()`` (200, text/html)   -> no error at all: the client returns the body as a
  ``str`` instead of a ``ChatCompletion``; the caller must check what it got
- ``RefusedPort().base_url``             -> ``openai.APIConnectionError`` (retried first): nothing
  listens there, every connection is refused at once (an LLM server that is down)

The client retries 408/409/429/5xx, timeouts and connection errors ``max_retries`` times. To
keep retries fast, send ``retry-after-ms`` (e.g. ``fault_status(429, headers=RETRY_NOW)``);
note that ``Retry-After: 0`` does NOT mean "immediately" to the client: it only honours
values > 0 and otherwise falls back to its 0.5 s+ exponential backoff.
"""

from __future__ import annotations

import contextlib
import http
import json
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar

__all__ = [
    "RETRY_NOW",
    "CompletionReply",
    "DelayFault",
    "DisconnectFault",
    "FakeLLMServer",
    "Handler",
    "InFlightProbe",
    "MalformedJSONFault",
    "RecordedRequest",
    "RefusedPort",
    "Reply",
    "RunawayReply",
    "StatusFault",
    "ToolCall",
    "TruncatedBodyFault",
    "fake_llm",
    "fault_delay",
    "fault_disconnect",
    "fault_malformed_json",
    "fault_non_json",
    "fault_status",
    "fault_truncated_body",
    "reply_text",
    "reply_tool_calls",
    "start_fake_llm",
    "tool_call",
]

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
DEFAULT_MODEL = "fake-model"

# Headers that make the openai client retry after 1 ms instead of its exponential backoff.
RETRY_NOW: dict[str, str] = {"retry-after-ms": "1"}

JSONDict = dict[str, Any]


# --------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class ToolCall:
    """One tool call in an assistant message. ``arguments`` is sent verbatim."""

    name: str
    arguments: str
    id: str

    def to_json(self) -> JSONDict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class Reply:
    """Base class of everything the server can answer a chat-completions request with."""

    def respond(self, h: _Handler, request: JSONDict) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class CompletionReply(Reply):
    """A successful (HTTP 200) chat.completion with an assistant message."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: JSONDict | None = None

    def to_json(self, request: JSONDict) -> JSONDict:
        message: JSONDict = {
            "role": "assistant",
            "content": self.content,
            "refusal": None,
            "annotations": [],
        }
        if self.tool_calls:
            message["tool_calls"] = [tc.to_json() for tc in self.tool_calls]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(request.get("model") or DEFAULT_MODEL),
            "system_fingerprint": "fp_fake_llm",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": self.usage if self.usage is not None else self._rough_usage(request),
        }

    def _rough_usage(self, request: JSONDict) -> JSONDict:
        # Deliberately rough and low (5 characters of the JSON per token, where
        # tiktoken's are about 3.8): the bot learns a server/our token ratio from it
        # only above 1, so this count never teaches one; the tools are counted (a
        # count without them is a server that left them out, bot/llm/client.py).
        # tests/strict_llm.py reports a server's real count.
        prompt = len(json.dumps([request.get("messages", []), request.get("tools") or []])) // 5
        out = len(self.content or "") + sum(len(t.name) + len(t.arguments) for t in self.tool_calls)
        completion = out // 4 + 1
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def respond(self, h: _Handler, request: JSONDict) -> None:
        if request.get("stream"):
            h.send_events(stream_events(self.to_json(request), request))
        else:
            h.send_json(200, self.to_json(request))


def stream_events(answer: JSONDict, request: JSONDict) -> list[JSONDict]:
    """A chat.completion as the chunks a streaming server sends: the text, each
    call, the finish reason, and the usage when the request asked for it."""
    choice = answer["choices"][0]
    message = choice["message"]
    head = {key: answer[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: JSONDict, finish: str | None = None) -> JSONDict:
        return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": message["content"]})]
    events += [chunk({"tool_calls": [call | {"index": i}]}) for i, call in enumerate(message.get("tool_calls", []))]
    events.append(chunk({}, choice["finish_reason"]))
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(head | {"choices": [], "usage": answer["usage"]})
    return events


@dataclass(frozen=True)
class RunawayReply(Reply):
    """A streamed answer that never ends on its own, as llama-cpp-python's
    chatml-function-calling writes past max_tokens: `piece` every `pause` seconds
    until the client closes the connection; `pieces` counts what was written."""

    piece: str = "la "
    pause: float = 0.002
    arguments: bool = False  # the pieces are a send_message call's arguments, not text
    pieces: list[int] = field(default_factory=lambda: [0])
    closed: threading.Event = field(default_factory=threading.Event)

    def respond(self, h: _Handler, request: JSONDict) -> None:
        head = {"id": "chatcmpl-runaway", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        h.start_events()
        call = {"index": 0, "id": "call_runaway", "type": "function"}
        first = True
        while not h.fake_server.stopping.is_set():
            delta: JSONDict = {"content": self.piece}
            if self.arguments:
                opening = {"name": "send_message", "arguments": '{"message": "'} if first else {}
                delta = {"tool_calls": [call | {"function": opening or {"arguments": self.piece}}]}
            first = False
            event = head | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            if not h.send_event(event):
                self.closed.set()
                return
            self.pieces[0] += 1
            time.sleep(self.pause)


@dataclass(frozen=True)
class StatusFault(Reply):
    """An HTTP error status with an OpenAI-style error body (or a custom body)."""

    status: int
    body: JSONDict | str | bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def respond(self, h: _Handler, request: JSONDict) -> None:
        body = self.body
        if body is None:
            body = _error_body(f"fake_llm scripted fault: HTTP {self.status}", _error_type(self.status))
        if isinstance(body, dict):
            h.send_json(self.status, body, self.headers)
        else:
            raw = body.encode() if isinstance(body, str) else body
            headers = {"Content-Type": "text/plain; charset=utf-8", **self.headers}
            h.send_raw(self.status, raw, headers)


@dataclass(frozen=True)
class DelayFault(Reply):
    """Sleep ``seconds`` (without blocking other requests), then answer with ``then``."""

    seconds: float
    then: Reply

    def respond(self, h: _Handler, request: JSONDict) -> None:
        if h.fake_server.stopping.wait(self.seconds):
            h.close_connection = True  # server is stopping: drop the request
            return
        self.then.respond(h, request)


@dataclass(frozen=True)
class MalformedJSONFault(Reply):
    """HTTP 200, ``Content-Type: application/json``, but a truncated (invalid) JSON body."""

    body: bytes = b'{"id": "chatcmpl-truncated", "object": "chat.completion", "choices": [{"in'

    def respond(self, h: _Handler, request: JSONDict) -> None:
        h.send_raw(200, self.body, {"Content-Type": "application/json"})


@dataclass(frozen=True)
class DisconnectFault(Reply):
    """Close the connection without sending any response."""

    def respond(self, h: _Handler, request: JSONDict) -> None:
        h.close_connection = True
        with contextlib.suppress(OSError):
            h.connection.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class TruncatedBodyFault(Reply):
    """HTTP 200 whose Content-Length announces a whole chat.completion, but only the first
    ``keep`` fraction of the body is sent before the connection closes: a server or proxy
    dying mid-response. (``MalformedJSONFault`` is the other case: short but complete.)"""

    keep: float = 0.5

    def respond(self, h: _Handler, request: JSONDict) -> None:
        body = json.dumps(CompletionReply(content="cut short").to_json(request)).encode()
        sent = body[: max(1, min(len(body) - 1, int(len(body) * self.keep)))]
        h.close_connection = True
        h.send_raw(200, sent, {"Content-Type": "application/json"}, declared_length=len(body))
        with contextlib.suppress(OSError):
            h.connection.shutdown(socket.SHUT_RDWR)


Handler = Callable[[JSONDict], Reply]


def tool_call(name: str, arguments: JSONDict | str, *, call_id: str | None = None) -> ToolCall:
    """A tool call; a dict is JSON-encoded, a str is sent verbatim (may be malformed JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(name=name, arguments=args, id=call_id or f"call_{uuid.uuid4().hex[:24]}")


def reply_tool_calls(
    *calls: ToolCall,
    content: str | None = None,
    finish_reason: str = "tool_calls",
    usage: JSONDict | None = None,
) -> CompletionReply:
    """An assistant message carrying one or more tool calls."""
    if not calls:
        raise ValueError("reply_tool_calls needs at least one tool_call(...)")
    return CompletionReply(content=content, tool_calls=tuple(calls), finish_reason=finish_reason, usage=usage)


def say(text: str) -> CompletionReply:
    """The agent's answer `text`: one send_message call (what most scripted turns reply)."""
    return reply_tool_calls(tool_call("send_message", {"message": text}))


def is_summary_request(request: JSONDict) -> bool:
    """A summarizer call, not an agent step: the chat model's summaries come
    with the agent's tools and tool_choice "none" (so they share the agent's
    cached prefix); a separate summary model's, without tools."""
    return not request.get("tools") or request.get("tool_choice") == "none"


def reply_text(text: str, *, finish_reason: str = "stop", usage: JSONDict | None = None) -> CompletionReply:
    """A plain assistant message with no tool calls."""
    return CompletionReply(content=text, finish_reason=finish_reason, usage=usage)


def fault_status(
    status: int,
    body: JSONDict | str | bytes | None = None,
    headers: dict[str, str] | None = None,
) -> StatusFault:
    """An HTTP error (e.g. 429, 500, 503). Pass ``headers=RETRY_NOW`` for fast client retries."""
    return StatusFault(status=status, body=body, headers=dict(headers or {}))


def fault_delay(seconds: float, then: Reply | None = None) -> DelayFault:
    """Sleep, then answer ``then`` (default: ``reply_text("delayed reply")``)."""
    if then is None:
        then = reply_text("delayed reply")
    return DelayFault(seconds=seconds, then=then)


def fault_malformed_json() -> MalformedJSONFault:
    """HTTP 200 whose body is truncated JSON."""
    return MalformedJSONFault()


def fault_disconnect() -> DisconnectFault:
    """Close the connection without a response."""
    return DisconnectFault()


def fault_truncated_body(keep: float = 0.5) -> TruncatedBodyFault:
    """HTTP 200 that sends only ``keep`` of the body its Content-Length promised, then closes."""
    return TruncatedBodyFault(keep=keep)


HTML_ERROR_PAGE = "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"


def fault_non_json(
    body: str = HTML_ERROR_PAGE, content_type: str = "text/html; charset=utf-8", status: int = 200
) -> StatusFault:
    """A complete body that is not JSON (by default an HTML error page a proxy serves with 200)."""
    return StatusFault(status=status, body=body, headers={"Content-Type": content_type})


def _error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_exceeded"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def _error_body(message: str, type_: str, code: str | None = None) -> JSONDict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


# --------------------------------------------------------------------------- server


@dataclass(frozen=True)
class RecordedRequest:
    """Everything received for one HTTP request (``body`` is None if it was not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    raw_body: bytes
    body: JSONDict | None
    received_at: float


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-llm/1.0"
    server: _HTTPServer  # narrowed for type checkers

    @property
    def fake_server(self) -> FakeLLMServer:
        return self.server.owner

    def setup(self) -> None:
        super().setup()
        # Without TCP_NODELAY, Nagle + delayed ACK add ~40 ms per round trip.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.fake_server._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.fake_server._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet

    # -- writing (always one write: status line + headers + body) --

    def send_raw(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        *,
        declared_length: int | None = None,
    ) -> None:
        """``declared_length`` overrides Content-Length (a lie, for truncated-body faults)."""
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        hdrs = {"Content-Type": "application/octet-stream", **(headers or {})}
        hdrs["Content-Length"] = str(len(body) if declared_length is None else declared_length)
        if self.close_connection:
            hdrs["Connection"] = "close"
        head = f"HTTP/1.1 {status} {reason}\r\n"
        head += f"Server: {self.server_version}\r\nDate: {self.date_time_string()}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        try:
            self.wfile.write(head.encode("latin-1") + b"\r\n" + body)
        except OSError:  # client went away (e.g. it timed out while we were delaying)
            self.close_connection = True

    def send_events(self, events: list[JSONDict]) -> None:
        """A whole server-sent event stream at once (each event a `data:` line, then [DONE])."""
        body = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
        self.send_raw(200, body.encode(), {"Content-Type": "text/event-stream"})

    def start_events(self) -> None:
        """The head of an event stream sent piece by piece (chunked), for `send_event`."""
        self.close_connection = True
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        self.wfile.write(f"{head}Connection: close\r\n\r\n".encode("latin-1"))

    def send_event(self, event: JSONDict) -> bool:
        """One event as one chunk; False once the client has gone."""
        data = f"data: {json.dumps(event)}\n\n".encode()
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        except OSError:
            return False
        return True

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_raw(status, body, {"Content-Type": "application/json", **(headers or {})})

    def send_api_error(self, status: int, message: str, *, retry: bool = True, code: str | None = None) -> None:
        headers = {} if retry else {"x-should-retry": "false"}
        self.send_json(status, _error_body(message, _error_type(status), code), headers)

    # -- reading --

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _record(self, raw: bytes, body: JSONDict | None) -> None:
        rec = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            raw_body=raw,
            body=body,
            received_at=time.time(),
        )
        self.fake_server._record(rec)

    # -- routes --

    def do_GET(self) -> None:
        raw = self._read_body()
        self._record(raw, None)
        if self.path.split("?", 1)[0].rstrip("/") == MODELS_PATH:
            models = [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake-llm"}
                for m in (DEFAULT_MODEL, "gpt-4o-mini", "gpt-4o")
            ]
            self.send_json(200, {"object": "list", "data": models})
        else:
            self.send_api_error(404, f"fake_llm: no route GET {self.path}", retry=False)

    def do_POST(self) -> None:
        raw = self._read_body()
        if self.path.split("?", 1)[0].rstrip("/") != CHAT_PATH:
            self._record(raw, None)
            self.send_api_error(404, f"fake_llm: no route POST {self.path}", retry=False)
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("request body is not a JSON object")
        except ValueError as exc:
            self._record(raw, None)
            self.send_api_error(400, f"fake_llm: request body is not JSON: {exc}", retry=False)
            return
        self._record(raw, body)
        if body.get("stream") and not self.fake_server.streaming:
            self.send_api_error(400, "fake_llm: streaming (stream=true) is not supported", retry=False)
            return
        strict = self.fake_server.strict
        if strict is not None:  # a strict server's checks, slots and token counts (tests/strict_llm.py)
            strict.serve(self, body)
            return
        self.serve_next(body)

    def next_reply(self, body: JSONDict) -> Reply:
        """The scripted reply; a loud 500 (not retried) if the handler raised or the script ran out."""
        no_retry = {"x-should-retry": "false"}
        try:
            reply = self.fake_server._next_reply(body)
        except Exception:
            message = f"fake_llm: handler raised:\n{traceback.format_exc()}"
            return StatusFault(500, _error_body(message, "server_error"), no_retry)
        if reply is None:
            message = (
                "fake_llm: script ran out: no scripted reply left and no handler set "
                f"(request #{len(self.fake_server.requests)})"
            )
            return StatusFault(500, _error_body(message, "server_error", "fake_llm_script_exhausted"), no_retry)
        return reply

    def serve_next(self, body: JSONDict) -> None:
        self.next_reply(body).respond(self, body)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, owner: FakeLLMServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Connection resets etc. are expected (timeouts, disconnect faults); stay quiet.
        pass


class FakeLLMServer:
    """A scriptable OpenAI-compatible server on 127.0.0.1 (free port), run in a daemon thread."""

    api_key: ClassVar[str] = "sk-fake-llm"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque()
        self._handler: Handler | None = None
        self._conns: set[socket.socket] = set()
        self.requests: list[JSONDict] = []
        self.raw_requests: list[RecordedRequest] = []
        # Benchmarks serve many thousands of requests: they switch recording off.
        self.keep_requests = True
        self.stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        # A strict server's behaviour (tests/strict_llm.py); None: accept anything.
        self.strict: Any = None
        # False: a request with stream=true is refused (400), as some servers do.
        self.streaming = True

    # -- lifecycle --

    def start(self) -> FakeLLMServer:
        if self._httpd is not None:
            return self
        self.stopping.clear()
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-llm:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self.stopping.set()  # wakes delayed handlers
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # drop idle keep-alive connections
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if thread is not None:
            thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeLLMServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting --

    def script(self, *replies: Reply) -> FakeLLMServer:
        """Append replies to the FIFO queue."""
        for r in replies:
            if not isinstance(r, Reply):
                raise TypeError(f"script() takes Reply objects, got {type(r).__name__}")
        with self._lock:
            self._queue.extend(replies)
        return self

    def set_handler(self, fn: Handler | None) -> FakeLLMServer:
        """Fallback used when the queue is empty (None removes it)."""
        with self._lock:
            self._handler = fn
        return self

    def reset(self) -> None:
        """Clear the queue, the handler and the recorded requests."""
        with self._lock:
            self._queue.clear()
            self._handler = None
            self.strict = None
            self.streaming = True
            self.requests.clear()
            self.raw_requests.clear()

    @property
    def pending(self) -> int:
        """Number of scripted replies not yet served."""
        with self._lock:
            return len(self._queue)

    # -- internals used by the request handler --

    def _next_reply(self, request: JSONDict) -> Reply | None:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            handler = self._handler
        if handler is None:
            return None
        reply = handler(request)
        if not isinstance(reply, Reply):
            raise TypeError(f"handler returned {type(reply).__name__}, expected a Reply")
        return reply

    def _record(self, rec: RecordedRequest) -> None:
        if not self.keep_requests:
            return
        with self._lock:
            self.raw_requests.append(rec)
            if rec.body is not None and rec.path.split("?", 1)[0].rstrip("/") == CHAT_PATH:
                self.requests.append(rec.body)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)


class InFlightProbe:
    """A handler wrapper that holds each request briefly and records the most
    requests served at once: 1 proves the caller never overlapped them."""

    def __init__(self, handler: Handler, hold_seconds: float = 0.01) -> None:
        self.handler = handler
        self.hold_seconds = hold_seconds
        self.most = 0
        self._now = 0
        self._lock = threading.Lock()

    def __call__(self, request: JSONDict) -> Reply:
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)
        try:
            threading.Event().wait(self.hold_seconds)
            return self.handler(request)
        finally:
            with self._lock:
                self._now -= 1


class RefusedPort:
    """A loopback port that is bound but never listens, so every connection to it is refused
    at once: an LLM server that is down. Keeping the socket bound (rather than picking a free
    port and closing it) stops anything else from taking the port while a test uses it."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RefusedPort:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_fake_llm() -> FakeLLMServer:
    """Start a new server; the caller must ``stop()`` it."""
    return FakeLLMServer().start()


@contextlib.contextmanager
def fake_llm() -> Iterator[FakeLLMServer]:
    """Context manager: a started server, stopped on exit."""
    server = start_fake_llm()
    try:
        yield server
    finally:
        server.stop()
