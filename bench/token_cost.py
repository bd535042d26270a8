"""What a user message costs in prompt tokens, and how much a provider's prompt
cache can serve: the scripted model, the real runtime, the real tokenizer.

Two chats are driven through `Runtime.handle` (what `memgpt-bot chat` calls for
each line): the 200-message script (plain messages, "remember" inserts,
searches, name saves) and a 1,000-turn chat of the same mix, each at an 8k and
a 32k window. The scripted model decides its calls from the request it gets,
deterministically, so every commit sees the same conversation. Every figure is
counted from the request bodies the local server received, tokenized with the
bot's own tokenizer:

- prefix share: tokens a request shares, from its first token, with the previous
  agent step's request (tools, then each message), over its tokens; token-weighted;
- effective tokens: uncached tokens + 25% of the shared prefix, for summarizer
  calls too (the chat model summarizes from the agent's own prompt, so a
  summarizer call shares the previous step's prefix up to the evicted messages;
  a separate summary model's prompt would be new every time);
- a naive full-history bot, computed from the same conversation: every call
  sends the whole history, append-only, so it is all cacheable but unbounded.

    python bench/token_cost.py [--only script200-8k] [--png docs/token_cost.png] [--queue-tokens N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bot.config import Settings
from bot.events import UserMessage
from bot.llm import LLMClient
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.sqlite.store import SQLiteStore
from memory.tokens import TokenCounter
from tests.fake_llm import (
    FakeLLMServer,
    Reply,
    is_summary_request,
    reply_text,
    reply_tool_calls,
    start_fake_llm,
    tool_call,
)

CACHED_PRICE = 0.25
LETTA = {"calls": 1.80, "prompt": 6_499, "share": 0.826, "effective": 2_910, "summaries": 61 / 2}
USER = "Sam"
EVENT_LINE = re.compile(r"^\[[^\]]+\] " + USER + r": (?P<text>.*)$", re.M)
# Where the bot has one, the per-call memory status rides in the newest message.
STATUS_LINE = re.compile(r"(?:^|\n)\[memory status\].*\Z", re.S)
STATUS_FIELD = re.compile(r', "memory_status": "(?:[^"\\]|\\.)*"\}$')

WORDS = (
    "garden weekend coffee project deadline sister brother train music concert recipe bread bike trail "
    "rain meeting manager budget holiday flight hotel museum painting novel chapter guitar lesson dentist "
    "appointment neighbour dog walk park lunch dinner friend birthday present cake movie series episode "
    "running knee doctor vegetables soup market tomato basil harbour boat island cousin wedding speech"
).split()
TOPICS = ("my sister's wedding", "the garden", "my knee", "the budget meeting", "the guitar lessons", "the trip")
NAMES = ("Sam", "Sammy", "Samuel", "S.", "Sam the gardener")


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize() + "."


def chat_script(count: int, seed: int) -> list[str]:
    """User lines: ~58% plain chat, 20% "remember", 18% searches, 4% name saves."""
    rng = random.Random(seed)
    lines = []
    for index in range(count):
        roll = rng.random()
        if roll < 0.58:
            lines.append(" ".join(sentence(rng, 6, 18) for _ in range(rng.randint(1, 3))))
        elif roll < 0.78:
            lines.append(f"Remember that {sentence(rng, 8, 20).lower()}")
        elif roll < 0.87:
            lines.append(f"What did I tell you about {rng.choice(TOPICS)}?")
        elif roll < 0.96:
            lines.append(f"Do you know anything about {rng.choice(TOPICS)}?")
        else:
            lines.append(f"Please call me {NAMES[index % len(NAMES)]}.")
    return lines


# -- the scripted model ------------------------------------------------------------
def without_status(message: dict[str, Any]) -> dict[str, Any]:
    content = str(message.get("content") or "")
    return {**message, "content": STATUS_FIELD.sub("}", STATUS_LINE.sub("", content))}


def scripted_model(request: dict[str, Any]) -> Reply:
    """What a capable function-calling model does (gpt-4o-mini's parallel tool
    calls, as the instructions ask): a search first, then the answer in the next
    step (it needs the results); a memory write and the answer together, in one
    step, without a heartbeat; plain chat answered at once. It reads the
    person's current name where it stands last: its own edit in the queue, else
    the working context in the system message."""
    messages = [without_status(m) for m in request["messages"]]
    if is_summary_request(request):
        return reply_text(scripted_summary(messages))
    rng = random.Random(len(messages))
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user" and _said(m)), default=-1)
    answer = tool_call("send_message", {"message": sentence(rng, 10, 30)})
    if last_user < 0 or any(m["role"] == "tool" for m in messages[last_user + 1 :]):
        return reply_tool_calls(answer)
    text = _said(messages[last_user])
    if text.startswith("What did I tell you about "):
        call = tool_call("conversation_search", {"query": text[26:-1], "request_heartbeat": True})
        return reply_tool_calls(call, content="Noting that.")
    if text.startswith("Do you know anything about "):
        call = tool_call("archival_memory_search", {"query": text[27:-1], "request_heartbeat": True})
        return reply_tool_calls(call, content="Noting that.")
    done = {"request_heartbeat": False}
    if text.startswith("Remember that "):
        call = tool_call("archival_memory_insert", {"content": "Sam said " + text[14:], **done})
    elif text.startswith("Please call me "):
        name = text[15:-1]
        current = _current_name(messages)
        if current:
            arguments = {"name": "human", "old_content": current, "new_content": f"Preferred name: {name}"}
            call = tool_call("core_memory_replace", {**arguments, **done})
        else:
            call = tool_call("core_memory_append", {"name": "human", "content": f"Preferred name: {name}", **done})
    else:
        return reply_tool_calls(answer)
    return reply_tool_calls(call, answer, content="Noting that.")


PREFERRED = re.compile(r"Preferred name: [^\n\"\\]*")


def _current_name(messages: Sequence[dict[str, Any]]) -> str:
    """The newest "Preferred name: ..." line: from the model's own last edit that
    worked (still in the queue), else as working context shows it."""
    results = {m.get("tool_call_id"): str(m.get("content") or "") for m in messages if m["role"] == "tool"}
    for message in reversed(messages[1:]):
        for call in message.get("tool_calls") or []:
            worked = '"status": "OK"' in results.get(call.get("id"), "")
            found = PREFERRED.findall(call["function"]["arguments"]) if worked else []
            if found and call["function"]["name"].startswith("core_memory"):
                return found[-1]
    shown = PREFERRED.search(str(messages[0]["content"]))
    return shown.group(0) if shown else ""


def _said(message: dict[str, Any]) -> str:
    found = EVENT_LINE.search(str(message.get("content") or ""))
    return found.group("text") if found else ""


def scripted_summary(messages: Sequence[dict[str, Any]]) -> str:
    """About half the words the summarizer is allowed, taken from what it read."""
    allowed = re.search(r"at most (\d+) words", str(messages[0]["content"]) + str(messages[-1]["content"]))
    read = messages[1:-1] if len(messages) > 2 else messages[-1:]
    words = " ".join(str(m.get("content") or "") for m in read).split()
    keep = min(len(words), int(allowed.group(1)) // 2 if allowed else 200)
    return "Summary: " + " ".join(words[-keep:])


# -- measuring the request bodies ----------------------------------------------------
@dataclass
class Figures:
    name: str
    window: int
    messages: int
    steps: int = 0
    summaries: int = 0
    step_tokens: list[int] = field(default_factory=list)
    step_cached: list[int] = field(default_factory=list)
    summary_tokens: float = 0.0  # cached prefix of a summarizer call at its price too
    naive_tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def per_message(self, value: float) -> float:
        return value / self.messages

    @property
    def prompt(self) -> float:
        return self.per_message(sum(self.step_tokens))

    @property
    def share(self) -> float:
        return sum(self.step_cached) / max(1, sum(self.step_tokens))

    @property
    def effective(self) -> float:
        fresh = sum(self.step_tokens) - sum(self.step_cached)
        return self.per_message(fresh + CACHED_PRICE * sum(self.step_cached) + self.summary_tokens)

    @property
    def naive_effective(self) -> float:
        previous, total = 0, 0.0
        for tokens in self.naive_tokens:
            total += tokens - previous + CACHED_PRICE * previous
            previous = tokens
        return self.per_message(total)


class PieceCounter:
    """Tokens of request pieces (the tool schemas, each message), each
    tokenized once: a chat template separates messages with special tokens, so
    BPE never merges across them."""

    def __init__(self, counter: TokenCounter) -> None:
        self.encoder = counter.encoder
        self.cache: dict[str, list[int]] = {}

    def tokens(self, piece: str) -> list[int]:
        found = self.cache.get(piece)
        if found is None:
            found = self.cache[piece] = self.encoder.encode_ordinary(piece)
        return found

    def pieces(self, request: dict[str, Any], messages: list[dict[str, Any]] | None = None) -> list[str]:
        out = [json.dumps(request.get("tools") or [], ensure_ascii=False)]
        for message in request["messages"] if messages is None else messages:
            calls = json.dumps(message.get("tool_calls") or "", ensure_ascii=False)
            out.append(f"<|{message['role']}|>{message.get('name', '')}{message.get('content') or ''}{calls}")
        return out

    def shared_prefix(self, previous: list[str], current: list[str]) -> int:
        shared = 0
        for old, new in zip(previous, current, strict=False):
            if old == new:
                shared += len(self.tokens(new))
                continue
            for a, b in zip(self.tokens(old), self.tokens(new), strict=False):
                if a != b:
                    break
                shared += 1
            break
        return shared


def measure(figures: Figures, requests: list[dict[str, Any]], counter: TokenCounter) -> None:
    pieces = PieceCounter(counter)
    previous: list[str] = []
    history: list[str] = []  # the naive bot's queue: every message ever, in order
    last_queue: list[str] = []
    for request in requests:
        current = pieces.pieces(request)
        total = sum(len(pieces.tokens(piece)) for piece in current)
        if is_summary_request(request):
            figures.summaries += 1
            shared = pieces.shared_prefix(previous, current)
            figures.summary_tokens += total - shared + CACHED_PRICE * shared
            continue
        figures.steps += 1
        figures.step_tokens.append(total)
        figures.step_cached.append(pieces.shared_prefix(previous, current))
        previous = current
        queue = pieces.pieces(request, [without_status(m) for m in request["messages"]])[2:]
        history += queue[_overlap(last_queue, queue) :]
        last_queue = queue
        figures.naive_tokens.append(sum(len(pieces.tokens(p)) for p in current[:2] + history))


def _overlap(old: list[str], new: list[str]) -> int:
    """How many leading items of `new` are the tail of `old` (a flush drops old's head)."""
    for start in range(len(old)):
        tail = old[start:]
        if new[: len(tail)] == tail:
            return len(tail)
    return 0


# -- one run -----------------------------------------------------------------------
async def run_chat(
    server: FakeLLMServer, embedder: Embedder, name: str, lines: list[str], window: int, queue_tokens: int
) -> Figures:
    server.reset()
    server.set_handler(scripted_model)
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            openai_api_key="bench",
            model="gpt-4o-mini",
            context_window=window,
            response_reserve=min(1_024, window // 8),
            data_dir=Path(data_dir),
            llm_max_retries=0,
            rate_limit_per_minute=0,
            daily_token_budget=0,
        )
        if queue_tokens and hasattr(settings, "queue_tokens"):
            settings.queue_tokens = queue_tokens
        llm = LLMClient(settings.model, api_key="bench", base_url=server.base_url, max_retries=0)
        store = SQLiteStore(Path(data_dir) / "bench.sqlite3")
        runtime = await Runtime.create(settings, store=store, llm=llm, embedder=embedder)
        started = time.perf_counter()
        for line in lines:
            await runtime.handle(UserMessage(platform="terminal", user_id="bench", display_name=USER, text=line))
        seconds = time.perf_counter() - started
        counter = runtime.services.counter
        await runtime.close(close_embedder=False)
    figures = Figures(name, window, len(lines), seconds=seconds)
    measure(figures, list(server.requests), counter)
    return figures


def report(runs: list[Figures]) -> None:
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}")
    header = (
        f"{'run':<16}{'calls/msg':>10}{'prompt/msg':>11}{'prefix':>8}{'effective':>10}"
        f"{'sum/100':>8}{'largest':>9}{'naive eff':>10}{'naive max':>10}{'time':>7}"
    )
    print(header)
    for f in runs:
        calls = f.per_message(f.steps + f.summaries)
        largest = max(f.step_tokens) / f.window
        print(
            f"{f.name:<16}{calls:>10.2f}{f.prompt:>11,.0f}{f.share:>8.3f}{f.effective:>10,.0f}"
            f"{100 * f.summaries / f.messages:>8.1f}{largest:>9.2f}{f.naive_effective:>10,.0f}"
            f"{max(f.naive_tokens) / f.window:>10.2f}{f.seconds:>6.0f}s"
        )
    print(
        f"{'Letta 0.11.7':<16}{LETTA['calls']:>10.2f}{LETTA['prompt']:>11,}{LETTA['share']:>8.3f}"
        f"{LETTA['effective']:>10,}{LETTA['summaries']:>8.1f}  (the issue's figures, 200-message script at 8k)"
    )
    print(
        "calls/msg: agent steps + summarizer calls; prefix: token-weighted share of each step's request that "
        "repeats the previous step's from the first token; effective: uncached + 25% of cached, summarizer "
        "calls included (their prefix shared with the previous step at 25%); "
        "largest: the biggest step prompt / window (pieces tokenized apart, a slight overcount)."
    )
    base = next((f for f in runs if f.name == "script200-8k"), None)
    if base is not None:
        print(
            f"script200-8k against Letta: effective x{base.effective / LETTA['effective']:.2f}, "
            f"prompt x{base.prompt / LETTA['prompt']:.2f}, naive full history effective "
            f"x{base.naive_effective / base.effective:.2f} of ours"
        )


def plot(runs: list[Figures], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chats = [f for f in runs if f.name.startswith("chat1000")]
    if not chats:
        return
    figure, axes = plt.subplots(len(chats), 1, figsize=(11, 3.4 * len(chats)), squeeze=False)
    for axis, f in zip(axes[:, 0], chats, strict=True):
        calls = range(len(f.step_tokens))
        axis.fill_between(calls, 0, f.step_cached, color="#4c9be8", alpha=0.6, step="mid", label="cached prefix")
        axis.fill_between(
            calls, f.step_cached, f.step_tokens, color="#e8744c", alpha=0.8, step="mid", label="new tokens"
        )
        axis.axhline(f.window, color="black", linewidth=0.8, linestyle="--", label="window")
        axis.set_title(
            f"{f.name}: prompt tokens per call over 1,000 user messages "
            f"(prefix share {f.share:.3f}, effective {f.effective:,.0f} tokens/message)"
        )
        axis.set_ylabel("tokens")
        axis.set_ylim(0, f.window * 1.05)
        axis.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("agent step (LLM call)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    print(f"wrote {path}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", help="run only these (script200-8k, chat1000-32k, ...)")
    parser.add_argument("--png", type=Path, help="write the per-call plot of the 1,000-turn chats here")
    parser.add_argument("--queue-tokens", type=int, default=0, help="MEMGPT_QUEUE_TOKENS for every run")
    args = parser.parse_args()
    plan = [
        (f"{chat}-{window // 1024}k", lines, window)
        for chat, lines in (("script200", chat_script(200, 7)), ("chat1000", chat_script(1_000, 11)))
        for window in (8_192, 32_768)
    ]
    server, embedder = start_fake_llm(), Embedder()
    runs = []
    try:
        for name, lines, window in plan:
            if args.only and name not in args.only:
                continue
            runs.append(await run_chat(server, embedder, name, lines, window, args.queue_tokens))
    finally:
        server.stop()
    report(runs)
    if args.png:
        plot(runs, args.png)


if __name__ == "__main__":
    asyncio.run(main())
