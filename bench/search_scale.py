"""Archival search at 10k, 100k and 1M passages: exact vs approximate (usearch).

For each size: build time and memory of the ANN index, search latency (median
and p95) of exact and approximate search in the same run, their ratio, and
recall@10 of the approximate index against exact search. Then, through the
real SQLiteStore (hybrid: FTS5 bm25 + vectors), load throughput and hybrid
search latency up to --store-max passages, unfiltered (from a DM) and filtered
by place (from a private channel, which sees 20% of the archive, and a public
one, which sees 10%).

Vectors are SYNTHETIC 384-d unit vectors (topics plus noise on a decaying
spectrum, shaped like sentence embeddings): embedding a million real passages
with MiniLM is not possible on this machine (it does 35-300 sentences a
second). Uniform random vectors are not used: in 384 dimensions they have no
near neighbours worth the name, which says nothing about real archives.

    python bench/search_scale.py [--max 1000000] [--store-max 100000] [--queries 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import numpy.typing as npt

from memory.places import Place, Visibility
from memory.search.ann_index import ANN_THRESHOLD, AnnIndex
from memory.search.vector_index import VectorIndex
from memory.sqlite.store import SQLiteStore
from memory.types import Block, Passage

DIM = 384
SIZES = (10_000, 100_000, 1_000_000)
WORDS = [f"w{n}" for n in range(20_000)]
# Where each passage was saved, by row: one in ten public, one in ten private, the rest in DMs.
PLACE_CYCLE = ["public:C1", "private:C2", *["dm"] * 8]


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, {platform.platform()}"


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def synthetic(n: int, seed: int, topics: int) -> npt.NDArray[np.float32]:
    """Unit vectors around `topics` centres on a power-law spectrum."""
    rng = np.random.default_rng(seed)
    centre_rng = np.random.default_rng(12345)  # the same topics for corpus and queries
    scales = ((1 + np.arange(DIM)) ** -0.5).astype(np.float32)
    centres = centre_rng.standard_normal((topics, DIM)).astype(np.float32) * scales
    out = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, 100_000):
        size = min(n, start + 100_000) - start
        chunk = centres[rng.integers(topics, size=size)]
        chunk += 0.6 * rng.standard_normal((size, DIM)).astype(np.float32) * scales
        out[start : start + size] = chunk / np.linalg.norm(chunk, axis=1, keepdims=True)
    return out


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def stats(times: list[float]) -> str:
    ordered = sorted(times)
    return f"median {statistics.median(times):7.2f} ms, p95 {ordered[int(0.95 * (len(ordered) - 1))]:7.2f} ms"


def vector_level(n: int, queries: int, threads: int) -> None:
    topics = max(10, n // 200)
    started = time.perf_counter()
    corpus = synthetic(n, seed=1, topics=topics)
    probe = synthetic(queries, seed=2, topics=topics)
    ids = np.arange(1, n + 1, dtype=np.int64)
    print(f"  generated {n:,} vectors in {time.perf_counter() - started:.1f} s")

    base = rss_mb()
    start = time.perf_counter()
    exact = VectorIndex(dim=DIM, capacity=n)
    exact.add(ids.tolist(), corpus)
    exact_build = time.perf_counter() - start
    exact_mb = rss_mb() - base
    truth = [{item for item, _ in exact.search(q, 10)} for q in probe]
    exact_times = [t for q in probe for t in timed(lambda q=q: exact.search(q, 10), 1)]

    base = rss_mb()
    start = time.perf_counter()
    ann = AnnIndex.build(ids, corpus, threads=threads)
    build = time.perf_counter() - start
    ann_mb = rss_mb() - base
    found = found_pool = 0
    ann_times: list[float] = []
    pool_times: list[float] = []
    for q, want in zip(probe, truth, strict=True):
        start = time.perf_counter()
        hits = ann.search(q, 10)
        ann_times.append((time.perf_counter() - start) * 1000)
        found += len(want & {item for item, _ in hits})
        start = time.perf_counter()
        pool = ann.search(q, 100)
        pool_times.append((time.perf_counter() - start) * 1000)
        # What the store ranks: the best 10 of a 100-candidate pool.
        found_pool += len(want & {item for item, _ in pool[:10]})
    recall = found / (10 * len(probe))
    recall_pool = found_pool / (10 * len(probe))
    ratio = statistics.median(exact_times) / statistics.median(ann_times)
    print(f"  exact  (numpy): {stats(exact_times)}; load {exact_build:.1f} s, +{exact_mb:,.0f} MB RSS")
    print(f"  ANN (usearch) : {stats(ann_times)}; top-100 pool {stats(pool_times)}")
    print(
        f"                  build {build:.1f} s ({n / build:,.0f} vectors/s, {threads} threads), "
        f"index {ann.memory_bytes / 2**20:,.0f} MB (+{ann_mb:,.0f} MB RSS), exact/ANN median ratio {ratio:.1f}x"
    )
    print(
        f"                  recall@10 vs exact: {recall:.3f} asking for 10, {recall_pool:.3f} as the store "
        f"searches (top 10 of a 100-candidate pool)"
    )


def batches(n: int, size: int, seed: int) -> Iterator[list[Passage]]:
    rng = np.random.default_rng(seed)
    vectors = synthetic(n, seed=seed, topics=max(10, n // 200))
    for start in range(0, n, size):
        batch = []
        for row in range(start, min(n, start + size)):
            words = " ".join(WORDS[i] for i in rng.zipf(1.3, size=12) % len(WORDS))
            text = f"note {row} code K{row:07d}: {words}"
            place = PLACE_CYCLE[row % len(PLACE_CYCLE)]
            batch.append(Passage(text, embedding=vectors[row].tolist(), place=place))
        yield batch


async def store_level(n: int, queries: int, threads: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteStore(Path(folder) / "scale.sqlite3")
        await store.open()
        store._search.build_threads = threads
        agent, _ = await store.get_or_create_agent("bench:scale", [Block("human", "", 100)])
        loading = 0.0
        for batch in batches(n, 2_000, seed=3):
            start = time.perf_counter()
            await store.insert_passages(agent.id, batch)
            loading += time.perf_counter() - start
        probe = synthetic(queries, seed=4, topics=max(10, n // 200)).tolist()
        start = time.perf_counter()
        await store.search_passages(agent.id, "", probe[0], 5)  # loads the vectors (and starts a build)
        await store.wait_for_search_indexes()
        warm = time.perf_counter() - start
        rng = np.random.default_rng(5)
        texts = [f"what about K{int(rng.integers(n)):07d} and {WORDS[int(rng.integers(50, 5000))]}" for _ in probe]
        times = []
        for text, vector in zip(texts, probe, strict=True):
            start = time.perf_counter()
            await store.search_passages(agent.id, text, vector, 5)
            times.append((time.perf_counter() - start) * 1000)
        mode = "ANN" if n >= ANN_THRESHOLD else "exact"
        print(
            f"  store: load {n / loading:,.0f} passages/s (with embeddings and FTS5 rows of analysed terms); "
            f"first search {warm:.1f} s (reads vectors{', builds ANN' if mode == 'ANN' else ''})"
        )
        print(f"  store hybrid search ({mode} + bm25, page of 5, event loop to rows): {stats(times)}")
        for where in (Place("private", "C2"), Place("public", "C1")):
            visible = Visibility.of(where)
            times = []
            for text, vector in zip(texts, probe, strict=True):
                start = time.perf_counter()
                page = await store.search_passages(agent.id, text, vector, 5, visible=visible)
                times.append((time.perf_counter() - start) * 1000)
                assert all(visible.sees(passage.place) for passage, _ in page.items)
            print(
                f"  ... filtered from {where.key} (sees {'20' if where.kind == 'private' else '10'}%): {stats(times)}"
            )
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max", type=int, default=1_000_000, help="largest archive size to measure")
    parser.add_argument("--store-max", type=int, default=100_000, help="largest size measured through SQLiteStore")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ANN build threads")
    args = parser.parse_args()
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f}")
    print("vectors: synthetic 384-d unit vectors (not real embeddings: 1M MiniLM embeddings cannot be made here)")
    started = time.perf_counter()
    for n in SIZES:
        if n > args.max:
            continue
        print(f"{n:,} passages:")
        vector_level(n, args.queries, args.threads)
        if n <= args.store_max:
            await store_level(n, args.queries, args.threads)
    print(f"(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    asyncio.run(main())
