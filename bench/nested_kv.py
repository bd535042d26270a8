"""Nested key-value retrieval, the MemGPT paper's multi-hop archival task.

140 UUID key-value pairs are stored as passages ("The value of key K is V.").
A value may itself be a key: a question at nesting level n needs n + 1
lookups, each search fed by the value the previous one found, until a value
is reached that is no key. The agent is asked for that final value.

    python bench/nested_kv.py --base-url URL --model NAME [--per-level 5]
    python bench/nested_kv.py --retrieval-only          # no LLM: is each hop's passage the top hit?
    python bench/nested_kv.py --scripted                # the harness itself, against the local test model

With --retrieval-only each hop is searched the way the agent searches (the key
as the query, through the real archival memory: embeddings + hybrid ranking),
and a hop counts as found when the passage holding that key is the top result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bot.events import UserMessage
from bot.runtime import Runtime
from memory.archival import ArchivalMemory
from memory.types import Message, Passage

PAIRS = 140
MAX_LEVEL = 4
_PASSAGE = "The value of key {key} is {value}."
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_FOUND = re.compile(rf"value of key ({_UUID}) is ({_UUID})")


@dataclass(frozen=True, slots=True)
class Chain:
    """One question: start at keys[0]; keys[i] maps to keys[i + 1]; the last
    key maps to `answer`. Its level is the number of extra hops."""

    keys: tuple[str, ...]
    answer: str

    @property
    def level(self) -> int:
        return len(self.keys) - 1


@dataclass(slots=True)
class Task:
    pairs: list[tuple[str, str]]
    chains: list[Chain]

    def passages(self) -> list[Passage]:
        return [Passage(text=_PASSAGE.format(key=k, value=v), source="nested-kv") for k, v in self.pairs]


def make_task(seed: int = 0, pairs: int = PAIRS, max_level: int = MAX_LEVEL, per_level: int = 6) -> Task:
    """`per_level` chains at each level 0..max_level, the rest of the `pairs`
    plain key-value pairs (distractors). Shuffled, so a chain's pairs are not
    stored next to each other."""
    rng = random.Random(seed)

    def new_uuid() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    chains: list[Chain] = []
    table: list[tuple[str, str]] = []
    for level in range(max_level + 1):
        for _ in range(per_level):
            keys = tuple(new_uuid() for _ in range(level + 1))
            answer = new_uuid()
            chains.append(Chain(keys, answer))
            table += list(zip(keys, [*keys[1:], answer], strict=True))
    if len(table) > pairs:
        raise ValueError(f"{len(table)} pairs needed for the chains, more than {pairs}")
    table += [(new_uuid(), new_uuid()) for _ in range(pairs - len(table))]
    rng.shuffle(table)
    return Task(table, chains)


# -- retrieval only ------------------------------------------------------------
@dataclass(slots=True)
class LevelScore:
    hops: int = 0
    hops_found: int = 0
    chains: int = 0
    chains_found: int = 0
    searches: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)


SIGNALS = ("hybrid", "vector", "keyword")


async def top_hit(archival: ArchivalMemory, agent_id: str, query: str, signal: str = "hybrid") -> str:
    """Text of the best passage for `query`, ranked by both signals or by one:
    "vector" sends no query text, "keyword" a zero vector (every cosine 0)."""
    if signal == "hybrid":
        page = await archival.search(agent_id, query, 1)
    else:
        await archival.settle(agent_id)
        vector = (await archival.embedder.embed_one(query)).tolist()
        if signal == "vector":
            page = await archival.store.search_passages(agent_id, "", vector, 1)
        else:
            page = await archival.store.search_passages(agent_id, query, [0.0] * len(vector), 1)
    return page.items[0][0].text if page.items else ""


async def retrieval_only(
    archival: ArchivalMemory, agent_id: str, task: Task, signal: str = "hybrid"
) -> dict[int, LevelScore]:
    """For every hop of every chain: is the passage holding that key the top hit?"""
    scores: dict[int, LevelScore] = {}
    for chain in task.chains:
        score = scores.setdefault(chain.level, LevelScore())
        all_found = True
        for key in chain.keys:
            top = await top_hit(archival, agent_id, key, signal)
            found = top.startswith(f"The value of key {key} ")
            score.hops += 1
            score.hops_found += found
            all_found &= found
        score.chains += 1
        score.chains_found += all_found
    return scores


# -- through an agent ------------------------------------------------------------
def question(chain: Chain) -> str:
    return (
        f"In your archival memory, find the value of key {chain.keys[0]}. A value may itself be a key: "
        "if so, look that key up too, and go on until you reach a value that is not a key. "
        "Reply with only that final value."
    )


async def load_task(runtime: Runtime, agent_key: str, task: Task) -> str:
    agent = await runtime.agent(agent_key)
    await runtime.archival.insert(agent.id, task.passages())
    agent.archival_count += len(task.pairs)
    await runtime.archival.settle(agent.id)
    return agent.id


def count_calls(messages: Sequence[Message], name: str) -> tuple[int, int]:
    """(calls of `name`, distinct result pages read by them) among `messages`."""
    calls, pages = 0, set()
    for message in messages:
        for call in message.tool_calls or []:
            function = call.get("function", {})
            if function.get("name") != name:
                continue
            calls += 1
            try:
                args = json.loads(function.get("arguments") or "{}")
            except ValueError:
                args = {}
            if isinstance(args, dict):
                pages.add((str(args.get("query", "")), int(args.get("page", 0) or 0)))
    return calls, len(pages)


async def run_agent(
    runtime: Runtime,
    task: Task,
    *,
    agent_key: str = "bench:nested-kv",
    per_level: int | None = None,
    verbose: bool = False,
) -> dict[int, LevelScore]:
    """Ask each question of the task (up to `per_level` per level) through the
    agent; a question is answered when a reply holds the final value."""
    agent_id = await load_task(runtime, agent_key, task)
    scores: dict[int, LevelScore] = {}
    asked: dict[int, int] = {}
    platform, user = agent_key.split(":", 1)
    for chain in task.chains:
        if per_level is not None and asked.get(chain.level, 0) >= per_level:
            continue
        asked[chain.level] = asked.get(chain.level, 0) + 1
        before = await runtime.store.count_messages(agent_id)
        result = await runtime.handle_with_details(UserMessage(platform=platform, user_id=user, text=question(chain)))
        produced = await runtime.store.messages_since(agent_id, before + 1)
        searches, pages = count_calls(produced, "archival_memory_search")
        correct = any(chain.answer in reply.text for reply in result.replies)
        score = scores.setdefault(chain.level, LevelScore())
        score.chains += 1
        score.chains_found += correct
        score.searches.append(searches)
        score.pages.append(pages)
        if verbose:
            replies = " | ".join(reply.text for reply in result.replies)[:120]
            print(
                f"  level {chain.level}: {'ok ' if correct else 'MISS'} {searches} searches, "
                f"{result.steps} steps; replied {replies!r}"
            )
    return scores


# -- the local scripted model (tests and --scripted) -------------------------------
def scripted_call(request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What a model that follows the chain would call next, from the request
    alone: search the key the question names, then each value found, reading
    a second page before it decides that a value is no key."""
    messages = request["messages"]
    last = last_event(messages)
    if last["role"] != "tool":
        keys = re.findall(_UUID, last.get("content") or "")
        if not keys:
            return "send_message", {"message": "I could not find a key in your question."}
        return "archival_memory_search", {"query": keys[-1], "request_heartbeat": True}
    asked = _last_call_args(messages)
    current, page = asked.get("query", ""), int(asked.get("page", 0) or 0)
    result = json.loads(last["content"]).get("result", "")
    for key, value in _FOUND.findall(result):
        if key == current:
            return "archival_memory_search", {"query": value, "request_heartbeat": True}
    if "call again with page=" in result and page < 1:
        return "archival_memory_search", {"query": current, "page": page + 1, "request_heartbeat": True}
    return "send_message", {"message": current}


def last_event(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The newest message a model acts on: a function result or the person's
    message, skipping system alerts (memory pressure) queued after them. The
    newest message may open with the bot's memory status line: not an event."""
    for message in reversed(messages):
        content = message.get("content") or ""
        if content.startswith("[memory status]"):
            content = content.partition("\n")[2]
        if message["role"] == "tool" or not content.startswith("[system alert]"):
            return message
    return messages[-1]


def _last_call_args(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    for message in reversed(messages):
        for call in message.get("tool_calls") or []:
            args = json.loads(call["function"]["arguments"])
            return args if isinstance(args, dict) else {}
    return {}


def scripted_reply(request: dict[str, Any]) -> Any:
    from tests.fake_llm import is_summary_request, reply_text, reply_tool_calls, tool_call

    if is_summary_request(request):
        return reply_text("The user asked for nested key lookups.")
    name, args = scripted_call(request)
    return reply_tool_calls(tool_call(name, args))


# -- command line ------------------------------------------------------------------
def print_scores(title: str, scores: dict[int, LevelScore], *, hops: bool) -> None:
    print(title)
    for level in sorted(scores):
        s = scores[level]
        line = f"  level {level}: chains {s.chains_found}/{s.chains} ({s.chains_found / max(s.chains, 1):.0%})"
        if hops:
            line += f", hops {s.hops_found}/{s.hops} ({s.hops_found / max(s.hops, 1):.0%})"
        if s.searches:
            line += (
                f", searches per question {sum(s.searches) / len(s.searches):.1f}"
                f", pages read {sum(s.pages) / len(s.pages):.1f}"
            )
        print(line)
    total = sum(s.chains_found for s in scores.values()), sum(s.chains for s in scores.values())
    print(f"  all levels: {total[0]}/{total[1]} ({total[0] / max(total[1], 1):.0%})")


async def main() -> None:
    from bot.config import Settings
    from bot.llm import LLMClient
    from memory.embeddings import Embedder
    from memory.sqlite.store import SQLiteStore

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint")
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument("--retrieval-only", action="store_true", help="no LLM: measure search alone")
    parser.add_argument("--scripted", action="store_true", help="use the local scripted test model")
    parser.add_argument("--per-level", type=int, default=5, help="questions per level through the agent")
    parser.add_argument("--seeds", type=int, default=3, help="retrieval-only: independent task sets")
    parser.add_argument("--context-window", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=16)
    args = parser.parse_args()
    if not (args.base_url or args.retrieval_only or args.scripted):
        parser.error("give --base-url URL --model NAME, or --retrieval-only, or --scripted")

    server = None
    if args.scripted:
        from tests.fake_llm import start_fake_llm

        server = start_fake_llm()
        server.set_handler(scripted_reply)
        args.base_url, args.model = server.base_url, "scripted"
        args.context_window = getattr(args, "context_window", None) or 32_768
    embedder = Embedder()
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            openai_api_key=args.api_key,
            openai_base_url=args.base_url,
            model=args.model,
            data_dir=Path(data_dir),
            max_steps_per_event=args.max_steps,
            rate_limit_per_minute=0,
            daily_token_budget=0,
        )  # a quality run: no limits
        if args.context_window:
            settings.context_window = args.context_window
        store = SQLiteStore(Path(data_dir) / "nested-kv.sqlite3")
        llm = LLMClient(settings.model, api_key=args.api_key, base_url=args.base_url or "http://127.0.0.1:9")
        runtime = await Runtime.create(settings, store=store, llm=llm, embedder=embedder)
        started = time.perf_counter()
        try:
            if args.retrieval_only:
                tasks = [make_task(seed) for seed in range(args.seeds)]
                agents = [await load_task(runtime, f"bench:kv{seed}", task) for seed, task in enumerate(tasks)]
                for signal in SIGNALS:
                    merged: dict[int, LevelScore] = {}
                    for task, agent_id in zip(tasks, agents, strict=True):
                        for level, score in (await retrieval_only(runtime.archival, agent_id, task, signal)).items():
                            into = merged.setdefault(level, LevelScore())
                            into.hops += score.hops
                            into.hops_found += score.hops_found
                            into.chains += score.chains
                            into.chains_found += score.chains_found
                    print_scores(
                        f"nested KV, retrieval only, {signal} ranking ({args.seeds} task sets of {PAIRS} pairs; "
                        "query = the key; found = its passage is the top hit):",
                        merged,
                        hops=True,
                    )
            else:
                scores = await run_agent(runtime, make_task(0), per_level=args.per_level, verbose=True)
                print_scores(f"nested KV through the agent ({args.model}):", scores, hops=False)
        finally:
            await runtime.close()
            if server is not None:
                server.stop()
        print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    asyncio.run(main())
