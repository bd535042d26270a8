"""Conversation search on LoCoMo: does recall storage find the evidence turns?

Each dev conversation (../shared/data/locomo-dev, see bench/locomo_data.py) is
imported into a fresh agent through the real store (SQLite; MongoDB too with
--mongodb URI), the way `memgpt-bot memory import` does, and every question of
categories 1-4 is searched with conversation search (RecallMemory.search: the
query embedding plus the store's ranking) with the question as the query.
recall@k = the share of the question's evidence turns among the top k,
averaged over questions. Printed per category and overall, beside plain BM25
over the same turns computed in this run (Okapi, k1 1.2, b 0.75, the words as
FTS5's unicode61 tokenizer splits them, no stemming, no stop words), with the
search latency (p50, p95, the query embedding included).

The latency target is for an agent of 10,000 messages: --scale N imports the
four conversations repeated (each copy a year later) into one agent of N
messages and times every question against it.

--path cli runs the same questions through the operator's command line
instead: each conversation is written as JSON lines, loaded with
`memgpt-bot memory import` and searched with `memgpt-bot memory search
--recall - --json` (real processes on a fresh data folder), so its recall@k
can be set beside the agent's (they must be equal).

    python bench/locomo_recall.py [--data DIR] [--mongodb URI] [--scale 10000] [--no-scale] [--path agent|cli|both]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.locomo_data import CATEGORIES, DEFAULT_DATA, Conversation, load
from memory.embeddings import Embedder
from memory.recall import RecallMemory
from memory.search.hybrid import tokens
from memory.store import Store
from memory.types import Message

K = (5, 10)


@dataclass(slots=True)
class Scores:
    """recall@5 and @10 per question, by category."""

    by_category: dict[int, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, category: int, ranked: Sequence[str], evidence: Sequence[str]) -> None:
        hits = tuple(sum(1 for e in evidence if e in set(ranked[:k])) / len(evidence) for k in K)
        self.by_category.setdefault(category, []).append(hits)  # type: ignore[arg-type]

    def mean(self, category: int | None, k: int) -> float:
        rows = self.by_category.get(category, []) if category else [r for v in self.by_category.values() for r in v]
        return statistics.fmean(r[K.index(k)] for r in rows) if rows else 0.0


def bm25_rank(conversation: Conversation, query: str, top: int) -> list[str]:
    """Plain Okapi BM25 (the FTS5 IDF) over the conversation's turns."""
    docs = [tokens(turn.content) for turn in conversation.turns]
    n = len(docs)
    avg = sum(map(len, docs)) / max(n, 1)
    df = Counter(word for doc in docs for word in set(doc))
    scores = [0.0] * n
    for word in dict.fromkeys(tokens(query)):
        if not df[word]:
            continue
        idf = max(1e-6, math.log((n - df[word] + 0.5) / (df[word] + 0.5)))
        for i, doc in enumerate(docs):
            f = doc.count(word)
            if f:
                scores[i] += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * len(doc) / avg))
    order = sorted(range(n), key=lambda i: (-scores[i], i))[:top]
    return [conversation.turns[i].dia_id for i in order if scores[i] > 0]


async def open_store(backend: str, folder: Path, mongodb: str | None) -> Store:
    if backend == "sqlite":
        from memory.sqlite.store import SQLiteStore

        store: Store = SQLiteStore(folder / f"{uuid.uuid4().hex}.db")
    else:
        from memory.mongo.store import MongoStore

        assert mongodb is not None
        store = MongoStore(mongodb, f"locomo_bench_{uuid.uuid4().hex[:12]}")
    await store.open()
    return store


async def drop(store: Store) -> None:
    database = getattr(store, "database", None)
    client = getattr(store, "_client", None)
    if database and client is not None:
        await client.drop_database(database)
    await store.close()


async def imported_agent(store: Store, embedder: Embedder, messages: list[Message]) -> tuple[RecallMemory, str]:
    """A fresh agent holding `messages`, every one embedded (searches settle the backlog first)."""
    agent, _ = await store.get_or_create_agent(f"terminal:{uuid.uuid4().hex[:8]}", [])
    for start in range(0, len(messages), 1000):
        await store.append_messages(agent.id, messages[start : start + 1000])
    recall = RecallMemory(store, embedder)
    await recall.search(agent.id, "warm up", 1)
    await recall.settle(agent.id)
    return recall, agent.id


async def run_backend(
    backend: str, conversations: list[Conversation], embedder: Embedder, mongodb: str | None, folder: Path
) -> tuple[Scores, list[float]]:
    scores, latencies = Scores(), []
    for conversation in conversations:
        store = await open_store(backend, folder, mongodb)
        try:
            recall, agent_id = await imported_agent(store, embedder, conversation.messages())
            by_seq = {n: turn.dia_id for n, turn in enumerate(conversation.turns, start=1)}
            for question in conversation.questions:
                start = time.perf_counter()
                page = await recall.search(agent_id, question.text, max(K))
                latencies.append((time.perf_counter() - start) * 1000)
                scores.add(question.category, [by_seq[m.seq] for m in page.items], question.evidence)
        finally:
            await drop(store)
    return scores, latencies


def run_cli(conversations: list[Conversation], folder: Path) -> Scores:
    """recall@k of `memgpt-bot memory import` then `memory search --recall`, as processes."""
    scores = Scores()
    command = [sys.executable, "-m", "cli.main"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for number, conversation in enumerate(conversations):
        data = folder / f"cli-{number}"
        data.mkdir()
        history = data / "history.jsonl"
        history.write_text(
            "".join(
                json.dumps({"role": t.role, "content": t.content, "timestamp": t.at.isoformat()}) + "\n"
                for t in conversation.turns
            ),
            encoding="utf-8",
        )
        user = ["--data-dir", str(data), "--user", "locomo"]
        subprocess.run([*command, "memory", "import", *user, str(history)], check=True, cwd=data, env=env)
        questions = "".join(question.text.replace("\n", " ") + "\n" for question in conversation.questions)
        search = [*command, "memory", "search", *user, "--recall", "-", "--json", "--limit", str(max(K))]
        answered = subprocess.run(search, input=questions, capture_output=True, text=True, cwd=data, env=env)
        if answered.returncode:
            raise SystemExit(f"memory search failed: {answered.stderr.strip()}")
        answers = [json.loads(line) for line in answered.stdout.splitlines() if line.strip()]
        by_seq = {n: turn.dia_id for n, turn in enumerate(conversation.turns, start=1)}
        for question, answer in zip(conversation.questions, answers, strict=True):
            scores.add(question.category, [by_seq[item["seq"]] for item in answer["results"]], question.evidence)
    return scores


async def scale_latency(
    backend: str, conversations: list[Conversation], embedder: Embedder, mongodb: str | None, folder: Path, size: int
) -> list[float]:
    """Search latency in one agent of `size` messages (the conversations repeated, a year apart)."""
    messages: list[Message] = []
    copy = 0
    while len(messages) < size:
        shift = timedelta(days=366 * copy)
        for conversation in conversations:
            messages.extend(replace(m, created_at=m.created_at + shift) for m in conversation.messages())
        copy += 1
    messages = sorted(messages[:size], key=lambda m: m.created_at)
    store = await open_store(backend, folder, mongodb)
    try:
        recall, agent_id = await imported_agent(store, embedder, messages)
        questions = [q.text for c in conversations for q in c.questions]
        latencies, parts = [], []
        for text in questions:
            start = time.perf_counter()
            await recall.search(agent_id, text, max(K))
            latencies.append((time.perf_counter() - start) * 1000)
            # The same search in its two parts: the query embedding, the store's ranking.
            start = time.perf_counter()
            vector = (await embedder.embed_one(text)).tolist()
            middle = time.perf_counter()
            await store.search_messages(agent_id, text, max(K), query_vector=vector)
            parts.append(((middle - start) * 1000, (time.perf_counter() - middle) * 1000))
        print(
            f"  ({backend}, {size:,} messages: query embedding p50 {percentile([p[0] for p in parts], 0.5):.1f} ms,"
            f" ranking in the store p50 {percentile([p[1] for p in parts], 0.5):.1f} ms,"
            f" p95 {percentile([p[1] for p in parts], 0.95):.1f} ms)",
            flush=True,
        )
        return latencies
    finally:
        await drop(store)


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def table(conversations: list[Conversation], baseline: Scores, results: dict[str, Scores]) -> str:
    counts = Counter(q.category for c in conversations for q in c.questions)
    head = f"{'category':<12} {'n':>4}  {'BM25 @5':>8} {'@10':>6}"
    for name in results:
        head += f"  {name + ' @5':>12} {'@10':>6}"
    lines = [head]
    for category in [*sorted(CATEGORIES), None]:
        label = CATEGORIES[category] if category else "overall"
        n = counts[category] if category else sum(counts.values())
        row = f"{label:<12} {n:>4}  {baseline.mean(category, 5):>8.3f} {baseline.mean(category, 10):>6.3f}"
        for scores in results.values():
            row += f"  {scores.mean(category, 5):>12.3f} {scores.mean(category, 10):>6.3f}"
        lines.append(row)
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--mongodb", help="also run against this MongoDB (a database per conversation, dropped after)")
    parser.add_argument("--scale", type=int, default=10_000, help="messages in the latency agent")
    parser.add_argument("--no-scale", action="store_true", help="skip the large-agent latency run")
    parser.add_argument(
        "--path",
        choices=("agent", "cli", "both"),
        default="agent",
        help="search as the agent does (RecallMemory), through `memgpt-bot memory import/search`, or both",
    )
    args = parser.parse_args()

    conversations = load(args.data)
    baseline = Scores()
    for conversation in conversations:
        for question in conversation.questions:
            baseline.add(question.category, bm25_rank(conversation, question.text, max(K)), question.evidence)

    embedder = Embedder()
    await embedder.warm_up()
    backends = ["sqlite", *(["mongodb"] if args.mongodb else [])] if args.path != "cli" else []
    results: dict[str, Scores] = {}
    timings: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.path != "agent":
            results["cli"] = await asyncio.to_thread(run_cli, conversations, Path(tmp))
        for backend in backends:
            results[backend], timings[backend] = await run_backend(
                backend, conversations, embedder, args.mongodb, Path(tmp)
            )
            if not args.no_scale:
                timings[f"{backend} {args.scale:,}"] = await scale_latency(
                    backend, conversations, embedder, args.mongodb, Path(tmp), args.scale
                )
    await embedder.close()

    questions = sum(len(c.questions) for c in conversations)
    print(f"LoCoMo dev: {len(conversations)} conversations, {questions} questions (categories 1-4)")
    print(table(conversations, baseline, results))
    print("\nconversation search latency, query embedding included (ms):")
    for name, values in timings.items():
        print(f"  {name:<16} p50 {percentile(values, 0.5):6.1f}  p95 {percentile(values, 0.95):6.1f}  ({len(values)})")


if __name__ == "__main__":
    asyncio.run(main())
