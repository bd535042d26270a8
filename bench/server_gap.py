"""Framework time per call as the LLM server sees it, on the real `memgpt-bot chat` path.

The scripted server (tests/fake_llm.py, with bench/token_cost.py's scripted
model) runs in this process and keeps its own clock: for every request it notes
when the request arrived and when it finished writing the answer. The gap from
one answer written to the next request's arrival is the time the caller spent
between two calls: for `memgpt-bot chat` (a subprocess fed the 200-message
script on standard input, 8k window, SQLite, the real embedding model) that is
parsing the answer, running the function, storing, counting and compiling the
next prompt, or finishing one event and starting the next. The same gap for the
bare openai client calling the same server in a loop (a subprocess too, run
before and after the chat) is the floor: framework time = the chat's gap minus
the client's, per kind of step that came before the gap. A second floor: the
bare async client (as the bot's: the SDK's aiohttp transport) sending the chat's own requests again and
parsing the chat's own answers, so the client's cost for an 8k-window body
(~30 KB of JSON to build and send) is not counted as the framework's.

    python bench/server_gap.py [--messages 200] [--window 8192] [--bare 200] [--count]
                               [--profile "-m cProfile -o chat.prof"]

`--count` also counts, inside the bot (bench/gap_probe), the worker-thread
hops (store calls, embeddings: each a wait on another thread, which a busy
machine makes long) and the main thread's CPU time in each gap.

`--profile` runs the chat under a profiler (the gaps are then inflated by it;
read its output for where the time goes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.token_cost import USER, chat_script, scripted_model
from tests.fake_llm import CompletionReply, FakeLLMServer, Reply, is_summary_request, reply_text, start_fake_llm

ROOT = Path(__file__).resolve().parents[1]
BARE_CLIENT = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="bench", max_retries=0)
for _ in range(int(sys.argv[2])):
    client.chat.completions.create(model="bench", messages=[{"role": "user", "content": "hi"}])
"""

# The same client, async and on the SDK's aiohttp transport as the bot's (bot/llm/client.py),
# sending the chat's own request bodies in order: what this client costs for these payloads (a 8k-window prompt
# with its schemas is ~30 KB to build and send) and these answers to parse.
BARE_REPLAY = """
import asyncio, json, sys, openai
KNOWN = {"model", "messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "temperature"}
async def main():
    client = openai.AsyncOpenAI(
        base_url=sys.argv[1], api_key="bench", max_retries=0, http_client=openai.DefaultAioHttpClient()
    )
    with open(sys.argv[2]) as lines:
        bodies = [json.loads(line) for line in lines]
    for body in bodies:
        extra = {k: v for k, v in body.items() if k not in KNOWN}
        await client.chat.completions.create(**{k: v for k, v in body.items() if k in KNOWN}, extra_body=extra or None)
    await client.close()
asyncio.run(main())
"""

KINDS = {
    "send_message": "send_message",
    "archival_memory_insert": "memory write",
    "core_memory_append": "memory write",
    "core_memory_replace": "memory write",
    "archival_memory_search": "archival search",
    "conversation_search": "recall search",
}


@dataclass
class Served:
    arrived: float
    answered: float
    kind: str


class TimedReply(Reply):
    """Answers with `inner` and notes, on the server's clock, when the answer was written."""

    def __init__(self, inner: Reply, arrived: float, log: list[Served], kind: str) -> None:
        self.inner, self.arrived, self.log, self.kind = inner, arrived, log, kind

    def respond(self, h: Any, request: dict[str, Any]) -> None:
        self.inner.respond(h, request)
        h.wfile.flush()
        self.log.append(Served(self.arrived, time.perf_counter(), self.kind))


def kind_of(request: dict[str, Any], reply: Reply) -> str:
    if is_summary_request(request):
        return "summary"
    if isinstance(reply, CompletionReply) and reply.tool_calls:
        return KINDS.get(reply.tool_calls[0].name, reply.tool_calls[0].name)
    return "text"


def timed(
    server: FakeLLMServer, model: Any, log: list[Served], exchanges: list[tuple[dict[str, Any], Reply]] | None = None
) -> None:
    """Serve `model`, noting each call's times in `log` (and, given `exchanges`, each request and answer)."""
    lock = threading.Lock()

    def handler(request: dict[str, Any]) -> Reply:
        arrived = time.perf_counter()
        with lock:
            reply = model(request)
            if exchanges is not None:
                exchanges.append((request, reply))
        return TimedReply(reply, arrived, log, kind_of(request, reply))

    server.reset()
    server.keep_requests = False
    server.set_handler(handler)


def gaps(log: list[Served]) -> dict[str, list[float]]:
    """Milliseconds from each answer written to the next request's arrival, by the answered step's kind."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    for before, after in itertools.pairwise(log):
        by_kind[before.kind].append((after.arrived - before.answered) * 1000)
    return by_kind


def run_bare(server: FakeLLMServer, count: int) -> list[float]:
    log: list[Served] = []
    timed(server, lambda request: reply_text("ok"), log)
    subprocess.run([sys.executable, "-c", BARE_CLIENT, server.base_url, str(count)], check=True)
    return [gap for values in gaps(log).values() for gap in values][5:]  # the first calls import and connect


def run_replay(server: FakeLLMServer, exchanges: list[tuple[dict[str, Any], Reply]]) -> dict[str, list[float]]:
    """The bare async client sending the chat's requests again, answered with the
    chat's answers: its gaps, by the kind of the step answered before."""
    log: list[Served] = []
    answers = iter([reply for _, reply in exchanges])
    timed(server, lambda request: next(answers), log)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as bodies:
        bodies.writelines(json.dumps(request) + "\n" for request, _ in exchanges)
        bodies.flush()
        subprocess.run([sys.executable, "-c", BARE_REPLAY, server.base_url, bodies.name], check=True)
    return gaps(log)


def terminal_model(request: dict[str, Any]) -> Reply:
    """bench/token_cost.py's scripted model, reading the terminal's event lines ("Sam in terminal: ...")."""
    messages = [
        {**m, "content": m["content"].replace(f"{USER} in terminal: ", f"{USER}: ")} if m["role"] == "user" else m
        for m in request["messages"]
    ]
    return scripted_model({**request, "messages": messages})


def run_chat(
    server: FakeLLMServer,
    lines: list[str],
    window: int,
    profile: str,
    count: bool,
    exchanges: list[tuple[dict[str, Any], Reply]],
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, Any]]]]:
    """The gaps by kind and, with `count`, what the bot did in each gap (bench/gap_probe);
    every request and answer goes to `exchanges`."""
    log: list[Served] = []
    timed(server, terminal_model, log, exchanges)
    with tempfile.TemporaryDirectory() as data_dir:
        probe = Path(data_dir) / "probe.json"
        paths = [str(ROOT / "bench" / "gap_probe")] if count else []
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [*paths, str(ROOT), os.environ.get("PYTHONPATH")])),
            "SERVER_GAP_PROBE": str(probe) if count else "",
            "OPENAI_API_KEY": "bench",
            "OPENAI_BASE_URL": server.base_url,
            "MEMGPT_MODEL": "gpt-4o-mini",
            "MEMGPT_CONTEXT_WINDOW": str(window),
            "MEMGPT_RESPONSE_RESERVE": str(min(1_024, window // 8)),
            "MEMGPT_LLM_MAX_RETRIES": "0",
            # The limits are checked and counted on every event, set too high to hold one back.
            "MEMGPT_RATE_LIMIT_PER_MINUTE": str(10**9),
            "MEMGPT_DAILY_TOKEN_BUDGET": str(10**15),
            "MEMGPT_DATA_DIR": data_dir,
        }
        command = [sys.executable, *profile.split(), "-m", "cli.main", "chat", "--user", USER]
        done = subprocess.run(
            command, input="\n".join(lines) + "\n", env=env, cwd=data_dir, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"memgpt-bot chat failed ({done.returncode}): {done.stderr[-2000:]}")
        answered = len([line for line in done.stdout.splitlines() if line.strip()])
        inside: dict[str, list[dict[str, Any]]] = defaultdict(list)
        if count:
            # The bot's gap n lies between its requests n and n + 1: after the server's answer n.
            for served, gap in zip(log, json.loads(probe.read_text()), strict=False):
                inside[served.kind].append(gap)
    print(f"chat: {len(lines)} messages in, {answered} replies out, {len(log)} LLM calls")
    return gaps(log), inside


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--window", type=int, default=8_192)
    parser.add_argument("--bare", type=int, default=200, help="bare client calls before and after the chat")
    parser.add_argument(
        "--profile", default="", help='a profiler to run the chat under, e.g. "-m cProfile -o chat.prof"'
    )
    parser.add_argument(
        "--count", action="store_true", help="also count the bot's thread hops and main-thread CPU per gap"
    )
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args()

    server = start_fake_llm()
    exchanges: list[tuple[dict[str, Any], Reply]] = []
    try:
        bare = run_bare(server, args.bare)
        chat, inside = run_chat(server, chat_script(args.messages, 7), args.window, args.profile, args.count, exchanges)
        replay = run_replay(server, exchanges)
        bare += run_bare(server, args.bare)
    finally:
        server.stop()

    floor = statistics.median(bare)
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, load {load()}")
    print(f"bare openai client gap between calls: p50 {floor:.2f} ms, p90 {pct(bare, 0.9):.2f} ms ({len(bare)} calls)")
    print(
        "columns: the chat's gap after each kind of step; 'client' is the bare client's gap sending 'hi'; "
        "'same bodies' is the bare async client's gap sending the chat's own requests (its answers parsed)"
    )
    print(
        f"{'after a step of kind':<22}{'calls':>6}{'p50 ms':>9}{'p90 ms':>9}{'- client':>10}"
        f"{'same bodies':>13}{'- same':>9}  (target <= +5 ms)"
    )
    figures: dict[str, float] = {"client_p50": floor}
    for kind in ("send_message", "memory write", "archival search", "recall search", "summary"):
        values = chat.get(kind, [])
        if not values:
            continue
        p50 = statistics.median(values)
        same = statistics.median(replay.get(kind) or [float("nan")])
        figures[kind] = p50 - floor
        figures[f"{kind} over same bodies"] = p50 - same
        print(
            f"{kind:<22}{len(values):>6}{p50:>9.2f}{pct(values, 0.9):>9.2f}{p50 - floor:>+10.2f}"
            f"{same:>13.2f}{p50 - same:>+9.2f}"
        )
    if inside:
        report_inside(inside)
    if args.json:
        print(json.dumps(figures))


def report_inside(inside: dict[str, list[dict[str, Any]]]) -> None:
    """What the bot did between two requests, counted (bench/gap_probe): holds on a busy machine."""
    print(
        "inside the bot, per gap: worker-thread hops (store calls, embeddings; mean), p50 of the bot's own"
        " gap (response read to next request sent), of its main-thread CPU and of its wait on the store"
        " (the time a store call was under way; calls in flight at once count once, as one round)"
    )
    for kind, records in inside.items():
        hops = [hop for record in records for hop in record["hops"]]
        embeds = sum("encode" in hop for hop in hops)
        cpu = statistics.median(record["cpu_ms"] for record in records)
        wall = statistics.median(record["wall_ms"] for record in records)
        store = statistics.median(record["db_ms"] for record in records)
        rounds = sum(record.get("rounds", 0) for record in records) / len(records)
        top = ", ".join(f"{name} {n / len(records):.1f}" for name, n in Counter(hops).most_common(6))
        print(
            f"  {kind:<18} hops {len(hops) / len(records):.1f} (embeddings {embeds / len(records):.1f}), "
            f"store rounds {rounds:.1f}; "
            f"gap {wall:.2f} ms, CPU {cpu:.2f} ms, store wait {store:.2f} ms; {top}"
        )


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


if __name__ == "__main__":
    main()
