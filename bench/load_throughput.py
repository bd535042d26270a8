"""Document loading throughput against the raw speed of the embedding model.

In the same run, on the same passages: "raw" is one `Embedder.encode_now`
call over the already-chunked texts (the model alone); "loader" is
`memory.ingest.loader.load_paths` from the files on disk into a fresh SQLite store
(reading, extraction, chunking, hashing, embedding and writing, end to end).
Rounds alternate which goes first, so a shared machine's drifting load hits
both alike. Three ratios are printed: the median of the rounds, best round
against best round (the least disturbed runs), and passages per CPU-second of
this process (work done, whatever other processes take from the machine). On
a quiet machine the three agree.

    python bench/load_throughput.py [--passages 384] [--rounds 3] [--max-tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memory.archival import ArchivalMemory
from memory.embeddings import Embedder
from memory.ingest.chunking import DEFAULT_OVERLAP_TOKENS, chunk_document
from memory.ingest.documents import extract_document
from memory.ingest.loader import load_paths
from memory.sqlite.store import SQLiteStore
from memory.tokens import TokenCounter, load_encoder

WORDS = (
    "the a of to and in garden soil water seed root leaf light frost season harvest compost tomato pepper basil "
    "morning evening plant grows needs when should every week month warm cold shade sun rain dry wet deep "
    "shallow prune feed mulch pest aphid slug bloom flower fruit ripe green yellow careful gently often rarely"
).split()


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, {platform.platform()}"


def write_corpus(folder: Path, counter: TokenCounter, passages: int, max_tokens: int) -> list[str]:
    """Markdown files of plain prose under headings, until chunking them gives
    `passages` passages; returns the chunk texts (what the raw run embeds)."""
    rng = random.Random(42)
    texts: list[str] = []
    number = 0
    while len(texts) < passages:
        number += 1
        sections = []
        for heading in range(rng.randint(2, 5)):
            paragraphs = [
                " ".join(
                    " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 22))).capitalize() + "."
                    for _ in range(rng.randint(2, 7))
                )
                for _ in range(rng.randint(2, 6))
            ]
            sections.append(f"## Part {heading + 1}\n\n" + "\n\n".join(paragraphs))
        path = folder / f"notes{number:03d}.md"
        path.write_text(f"# Notes {number}\n\n" + "\n\n".join(sections) + "\n")
        document = extract_document(path.name, path.read_bytes())
        texts.extend(chunk.text for chunk in chunk_document(document, counter, max_tokens, DEFAULT_OVERLAP_TOKENS))
    return texts


Rates = tuple[float, float]  # passages per wall second, per CPU second


def raw_rate(embedder: Embedder, texts: list[str]) -> Rates:
    started, cpu = time.perf_counter(), time.process_time()
    embedder.encode_now(texts)
    return len(texts) / (time.perf_counter() - started), len(texts) / (time.process_time() - cpu)


async def loader_rate(embedder: Embedder, counter: TokenCounter, folder: Path, db: Path, max_tokens: int) -> Rates:
    store = SQLiteStore(db)
    await store.open()
    try:
        agent, _ = await store.get_or_create_agent("bench:loader", [])
        started, cpu = time.perf_counter(), time.process_time()
        report = await load_paths(
            ArchivalMemory(store, embedder), agent.id, [folder], counter=counter, max_tokens=max_tokens, progress=False
        )
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
        assert not report.failed, report.failed
        return report.passages_added / seconds, report.passages_added / cpu_seconds
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()

    counter = TokenCounter(load_encoder("gpt-4o-mini"))
    embedder = Embedder()
    await embedder.warm_up()
    embedder.encode_now(["warm up the model's first call"])
    print(machine())
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        corpus = root / "corpus"
        corpus.mkdir()
        texts = write_corpus(corpus, counter, args.passages, args.max_tokens)
        files = len(list(corpus.iterdir()))
        print(
            f"{len(texts)} passages of at most {args.max_tokens} tokens from {files} Markdown files; "
            f"{args.rounds} rounds\n"
        )
        print(
            f"{'round':>5}  {'raw encode_now':>16}  {'loader':>16}  {'ratio':>6}  {'per CPU-s: raw':>15}  "
            f"{'loader':>7}  {'ratio':>6}"
        )
        raws: list[Rates] = []
        loads: list[Rates] = []
        for number in range(1, args.rounds + 1):
            db = root / f"round{number}.sqlite3"
            if number % 2:
                raw = raw_rate(embedder, texts)
                loaded = await loader_rate(embedder, counter, corpus, db, args.max_tokens)
            else:
                loaded = await loader_rate(embedder, counter, corpus, db, args.max_tokens)
                raw = raw_rate(embedder, texts)
            raws.append(raw)
            loads.append(loaded)
            print(
                f"{number:>5}  {raw[0]:>12.1f} p/s  {loaded[0]:>12.1f} p/s  {loaded[0] / raw[0]:>6.2f}  "
                f"{raw[1]:>15.1f}  {loaded[1]:>7.1f}  {loaded[1] / raw[1]:>6.2f}",
                flush=True,
            )
    wall = statistics.median(load[0] / raw[0] for raw, load in zip(raws, loads, strict=True))
    best = max(load[0] for load in loads) / max(raw[0] for raw in raws)
    cpu = statistics.median(load[1] / raw[1] for raw, load in zip(raws, loads, strict=True))
    print(
        f"\nloader/raw (target >= 0.90): median of rounds {wall:.2f}, best round vs best round {best:.2f}, "
        f"per CPU-second {cpu:.2f}"
    )
    await embedder.close()


if __name__ == "__main__":
    asyncio.run(main())
