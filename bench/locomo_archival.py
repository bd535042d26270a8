"""Archival search on LoCoMo: does archival_memory_search find the evidence?

The turns of each dev conversation (../shared/data/locomo-dev, see
bench/locomo_data.py) are saved as archival passages ("Name: what they said",
embedded with the bundled MiniLM model) of a fresh agent in a fresh store, and
every question of categories 1-4 is searched with the store's hybrid archival
ranking (Store.search_passages: the question's embedding plus the keyword
bonus, memory/search/hybrid.py), the question as the query. recall@k = the
share of the question's evidence turns among the top k, averaged over
questions; printed per category and overall, with the search latency (p50,
p95, the store's ranking only: embeddings are computed before the clock starts).

Unlike bench/locomo_recall.py (conversation search, with neighbour context,
speaker and time signals), a passage here stands alone: this measures the
archival ranking's keyword side (stemming, stop words) on real questions.

    python bench/locomo_archival.py [--data DIR] [--mongodb URI]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.locomo_data import CATEGORIES, DEFAULT_DATA, Conversation, load
from bench.locomo_recall import K, Scores, drop, open_store, percentile
from memory.embeddings import Embedder
from memory.types import Passage


async def run_backend(
    backend: str, conversations: list[Conversation], embedder: Embedder, mongodb: str | None, folder: Path
) -> tuple[Scores, list[float]]:
    scores, latencies = Scores(), []
    for conversation in conversations:
        texts = [turn.content for turn in conversation.turns]
        vectors = await embedder.embed(texts)
        questions = await embedder.embed([q.text for q in conversation.questions])
        store = await open_store(backend, folder, mongodb)
        try:
            agent, _ = await store.get_or_create_agent(f"terminal:{uuid.uuid4().hex[:8]}", [])
            passages = [Passage(text, embedding=vectors[n].tolist()) for n, text in enumerate(texts)]
            ids = await store.insert_passages(agent.id, passages)
            dia_of = {pid: turn.dia_id for pid, turn in zip(ids, conversation.turns, strict=True)}
            for question, vector in zip(conversation.questions, questions, strict=True):
                start = time.perf_counter()
                page = await store.search_passages(agent.id, question.text, vector.tolist(), max(K))
                latencies.append((time.perf_counter() - start) * 1000)
                ranked = [dia_of[p.id] for p, _ in page.items if p.id is not None]
                scores.add(question.category, ranked, question.evidence)
        finally:
            await drop(store)
    return scores, latencies


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--mongodb", help="also run against this MongoDB (a database per conversation, dropped after)")
    args = parser.parse_args()
    conversations = load(args.data)
    embedder = Embedder()
    backends = ["sqlite"] + (["mongodb"] if args.mongodb else [])
    questions = sum(len(c.questions) for c in conversations)
    print(f"LoCoMo dev, archival search: {len(conversations)} conversations, {questions} questions")
    try:
        with tempfile.TemporaryDirectory() as folder:
            for backend in backends:
                started = time.perf_counter()
                scores, latencies = await run_backend(backend, conversations, embedder, args.mongodb, Path(folder))
                print(f"{backend}:")
                for category in [*sorted(CATEGORIES), None]:
                    label = CATEGORIES[category] if category else "overall"
                    print(f"  {label:<12} recall@5 {scores.mean(category, 5):.3f}  @10 {scores.mean(category, 10):.3f}")
                print(
                    f"  search p50 {statistics.median(latencies):.1f} ms, p95 {percentile(latencies, 0.95):.1f} ms"
                    f" ({time.perf_counter() - started:.0f} s with loading)"
                )
    finally:
        await embedder.close()


if __name__ == "__main__":
    asyncio.run(main())
