"""Six short messages through a small local server, as a new user tries the bot
(issue 39): a person's name, a pet, a city, then questions about them, through
`Runtime.handle` with SmolLM2-135M-Instruct on each real server
(tests/real_llm_servers.py, a recording proxy between bot and server), and the
same six sent bare (no memory, a one-line system prompt) to the same server in
the same run.

Per server it prints: messages answered by the model (not the trouble line),
requests the server refused, whether the functions were offered (and whether
the bot warned that the chat template drops them), calls the model made, the
share of each request the server served from its prompt cache (usage
`prompt_tokens_details.cached_tokens` or llama-server's `timings.cache_n`;
llama-cpp-python's own log of the request's first generation, "N prefix-match
hit, remaining M prompt tokens to eval", where its stream carries no usage:
tests/real_llm_servers.py, Exchange.cached_share), and seconds per message against bare: the first message (which reads
the whole fixed prompt) apart; the goal after it is at most 5x.

    python bench/local_server.py                          # both servers, a table after each
    python bench/local_server.py --server llama-server --context 4096
    python bench/local_server.py --server llama-cpp-python --dump /tmp/exchanges.json

Each server's table is printed as soon as that server is done, so a failure on
one (it is reported, and the next server runs) still shows the other's figures.

The servers must be built first: scripts/install_llama_server.sh,
scripts/install_llama_cpp_python.sh, scripts/install_smollm2.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bot.config import Settings
from bot.events import UserMessage
from bot.llm import LLMClient, Request
from bot.runtime import Runtime
from memory.embeddings import Embedder
from tests.real_llm_servers import (
    MODEL_ALIAS,
    SERVER_KINDS,
    Exchange,
    RealServer,
    RecordingProxy,
    ServerUnavailable,
    bot_environment,
    refused,
)

MESSAGES = [
    "Hello!",
    "My name is Dana.",
    "I have a cat called Miso.",
    "I live in Lisbon.",
    "What is my cat called?",
    "Where do I live?",
]
BARE_SYSTEM = "You are a helpful assistant."
GOAL = 5.0


@dataclass
class Measured:
    kind: str
    answered: int = 0
    refused: int = 0
    offered: bool = False
    warned: bool = False
    calls: int = 0
    requests: int = 0
    # The cached share of each request: the first of each message, and the others.
    first_cached: list[float] = field(default_factory=list)
    later_cached: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)


async def through_the_bot(
    kind: str, server: RealServer, context: int, embedder: Embedder, dump: Path | None
) -> Measured:
    measured = Measured(kind)
    proxy = RecordingProxy(server.port, server.log_path)
    data = Path(tempfile.mkdtemp(prefix="memgpt-local-bench-"))
    settings = Settings.from_mapping(bot_environment(proxy.base_url, data, context))
    runtime = await Runtime.create(settings, embedder=embedder)
    firsts: set[int] = set()  # the index (among the completions) of each message's first request
    try:
        for text in MESSAGES:
            await asyncio.sleep(0.5)  # the proxy records an exchange once it has passed on its last byte
            firsts.add(len(proxy.completions()))
            started = time.monotonic()
            result = await runtime.handle_with_details(UserMessage(platform="terminal", user_id="dana", text=text))
            measured.seconds.append(time.monotonic() - started)
            said = " ".join(reply.text for reply in result.replies).strip()
            measured.replies.append(said)
            measured.answered += bool(said) and "having trouble" not in said.lower()
        measured.warned = runtime.llm.endpoint.tools_dropped
    finally:
        await runtime.close(close_embedder=False)
        proxy.close()
    completions = proxy.completions()
    if dump is not None:
        write_exchanges(dump.with_name(f"{dump.stem}-{kind}{dump.suffix}"), completions, firsts)
    measured.requests = len(completions)
    measured.refused = len(refused(completions))
    measured.offered = any((e.request or {}).get("tools") for e in completions)
    for exchange in completions:
        message = ((exchange.response or {}).get("choices") or [{}])[0].get("message") or {}
        measured.calls += len(message.get("tool_calls") or [])
    shares = [(index in firsts, e.cached_share) for index, e in enumerate(completions)]
    for first, share in shares:
        if share is not None:
            (measured.first_cached if first else measured.later_cached).append(share)
    shown = " ".join(f"{'|' if first else ''}{share:.2f}" for first, share in shares if share is not None)
    print(f"[{kind}] cached share per request ('|': a message's first): {shown}", flush=True)
    return measured


def write_exchanges(path: Path, completions: list[Exchange], firsts: set[int]) -> None:
    """What the bot asked and the server answered, request by request, for reading a run."""
    rows = []
    for index, exchange in enumerate(completions):
        request = exchange.request or {}
        messages = request.get("messages") or []
        rows.append(
            {
                "first of a message": index in firsts,
                "status": exchange.status,
                "seconds": round(exchange.seconds, 1),
                "tool_choice": request.get("tool_choice"),
                "stream": request.get("stream"),
                "stop": request.get("stop"),
                "tools": len(request.get("tools") or []),
                "max_tokens": request.get("max_tokens"),
                "messages": len(messages),
                "last messages": messages[-3:],
                "answer": ((exchange.response or {}).get("choices") or [{}])[0].get("message"),
                "left": exchange.left,
                "error": exchange.error[:300],
                "cached share": exchange.cached_share,
                "server prompt tokens": exchange.server_prompt_tokens,
            }
        )
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    print(f"exchanges written to {path}", flush=True)


async def bare(server: RealServer, measured: Measured) -> None:
    client = LLMClient(MODEL_ALIAS, api_key="local", base_url=server.base_url, timeout=600)
    try:
        for text in MESSAGES:
            started = time.monotonic()
            messages = [{"role": "system", "content": BARE_SYSTEM}, {"role": "user", "content": text}]
            await client.complete(Request(messages, max_tokens=128))
            measured.bare.append(time.monotonic() - started)
    finally:
        await client.close()


def mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")  # shown as "nan": none measured


def yes(value: bool) -> str:
    return "yes" if value else "no"


def table(results: list[Measured]) -> str:
    rows: list[tuple[str, Callable[[Measured], str]]] = [
        ("answered (not trouble) / sent", lambda m: f"{m.answered} / {len(MESSAGES)}"),
        ("refused requests / requests", lambda m: f"{m.refused} / {m.requests}"),
        (
            "functions offered / warned dropped",
            lambda m: f"{'yes' if m.offered else 'no'} / {'yes' if m.warned else 'no'}",
        ),
        ("function calls made", lambda m: str(m.calls)),
        ("cached share, first request of a message", lambda m: f"{mean(m.first_cached):.2f}"),
        ("cached share, later requests (goal >= 0.9)", lambda m: f"{mean(m.later_cached):.2f}"),
        ("first message: bot s / bare s", lambda m: f"{m.seconds[0]:.1f} / {m.bare[0]:.1f}"),
        ("messages 2-6: bot s / bare s (mean)", lambda m: f"{mean(m.seconds[1:]):.1f} / {mean(m.bare[1:]):.1f}"),
        (f"messages 2-6: bot / bare (goal <= {GOAL:.0f}x)", lambda m: f"{mean(m.seconds[1:]) / mean(m.bare[1:]):.1f}x"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':<{width}}  " + "  ".join(f"{m.kind:>18}" for m in results)]
    lines += [f"{name:<{width}}  " + "  ".join(f"{show(m):>18}" for m in results) for name, show in rows]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    """Each server in turn, its table printed as soon as it is done (one server's failure
    is reported and the next one runs)."""
    embedder = Embedder()
    try:
        for kind in args.server or SERVER_KINDS:
            try:
                server = RealServer(kind, args.context)
                server.start()
            except ServerUnavailable as error:
                print(f"{kind}: skipped ({error})", flush=True)
                continue
            try:
                measured = await through_the_bot(kind, server, args.context, embedder, args.dump)
                await bare(server, measured)
            except Exception:
                logging.exception("%s: the run failed; server log:\n%s", kind, server.log_tail())
                continue
            finally:
                server.stop()
            for text, reply in zip(MESSAGES, measured.replies, strict=True):
                print(f"[{kind}] {text!r} -> {reply[:160]!r}", flush=True)
            print(f"\n{table([measured])}\n", flush=True)
    finally:
        await embedder.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", action="append", choices=SERVER_KINDS, help="one server (default: both)")
    parser.add_argument("--context", type=int, default=8192, help="the server's context and the bot's window")
    parser.add_argument(
        "--dump", type=Path, help="write each server's exchanges (request and answer) as JSON: PATH-<server>.json"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
