"""Channel memory (memory/channels.py): how fast a listening channel's lines
are kept, embedding included, against the bare embedding rate in the same
run, and how fast a channel's memory is searched once it is large.

Keep: N lines (default 2,000) are heard one after another, as a listening bot
keeps them (each `ChannelListener.hear` awaited: the channel's mode and the
speaker's consent from their caches, one append and the consent read after it,
the embedding left to RecallMemory's background batches), and the clock stops
once every line is embedded. "Bare" is `Embedder.encode_now` (the model alone, no store, batches
of recall.BATCH) on the same lines, measured just before and just after (the
mean of the two, so a shared machine's drifting load hits both alike). The
ratio is the issue's yardstick (at least 0.8).

Search: a channel of --lines lines (10,000; --large: 100,000), written in
bulk with synthetic 384-d vectors (embedding 100,000 real lines would take
this machine many minutes; the ranking's cost does not depend on where the
vectors came from), then `ChannelMemory.search` with real query embeddings:
the first search (the index read from the store) and the p50 / p95 of the
next ones, query embedding included.

    python bench/channel_memory.py [--keep 2000] [--lines 10000 | --large] [--mongodb URI | --ferretdb [--postgres]]

--ferretdb starts FerretDB as the tests do (tests/mongo_server.py: 1.24 on
its SQLite handler, which answers every query but one on `_id` alone by
reading the whole collection); with --postgres, on a throwaway PostgreSQL
(bench/postgres_server.py), whose handler pushes equalities down. SQLite runs
first, then the MongoDB server, in one process: compare ratios within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench.load_throughput import WORDS, machine
from bot.channels.listening import ChannelListener
from bot.channels.port import ChannelRef, Heard
from memory.channels import ChannelMemory, as_message, memory_key
from memory.embeddings import Embedder
from memory.places import Place
from memory.recall import BATCH, RecallMemory
from memory.store import Store
from memory.types import ChannelLine

CHANNEL = "slack:T01:C01"
SPEAKERS = [(f"slack:T01:U{n:02d}", name) for n, name in enumerate(["alice", "bob", "carol", "dave", "erin"])]
QUERIES = [
    "what did we decide about the launch?",
    "what did alice say about the harbour bridge?",
    "when is the council meeting",
    "who mentioned the copper ledger last week",
    "winter orchard timber",
]
BULK = 500  # lines per append when filling a channel for the search figures
DIM = 384


def lines(count: int, start: datetime, seed: int = 7) -> list[ChannelLine]:
    rng = random.Random(seed)
    made = []
    for n in range(count):
        speaker, name = SPEAKERS[n % len(SPEAKERS)]
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18)))
        made.append(ChannelLine(CHANNEL, f"m{n}", speaker, name, text, start + timedelta(seconds=30 * n), "public:C01"))
    return made


async def open_store(folder: Path, mongodb: str) -> Store:
    if mongodb:
        from memory.mongo.store import MongoStore

        store: Store = MongoStore(mongodb, f"channel_bench_{uuid.uuid4().hex[:12]}")
    else:
        from memory.sqlite.store import SQLiteStore

        store = SQLiteStore(folder / f"channel-{uuid.uuid4().hex[:6]}.db")
    await store.open()
    return store


async def drop(store: Store) -> None:
    from memory.mongo.store import MongoStore

    if isinstance(store, MongoStore) and store._client is not None:
        await store._client.drop_database(store.database)
    await store.close()


def bare_rate(embedder: Embedder, texts: list[str]) -> float:
    started = time.perf_counter()
    for start in range(0, len(texts), BATCH):
        embedder.encode_now(texts[start : start + BATCH])
    return len(texts) / (time.perf_counter() - started)


async def keep_rate(store: Store, embedder: Embedder, kept: list[ChannelLine]) -> tuple[float, float]:
    """Lines per second kept and embedded, and kept only (the appends' own pace), each heard
    as an adapter hands it over (bot/channels/listening.py: the channel's mode and the
    speaker's consent from their caches, the append, the consent read after it)."""
    recall = RecallMemory(store, embedder)
    channels = ChannelMemory(store, recall)
    listener = ChannelListener(channels)
    where = ChannelRef("slack", "T01", Place("public", "C01"))
    started = time.perf_counter()
    for line in kept:
        await listener.channel_mode(where, "listen")
        user = line.speaker.removeprefix("slack:")
        await listener.hear(Heard(where, line.message_id, user, line.speaker_name, line.text, line.said_at))
    appended = time.perf_counter() - started
    await channels.settle(CHANNEL)
    record = await store.find_agent(memory_key(CHANNEL))
    assert record is not None
    while await store.messages_without_embedding(record.id, 1):  # a last run may still be starting
        await asyncio.sleep(0.01)
        await channels.settle(CHANNEL)
    total = time.perf_counter() - started
    await recall.close()
    return len(kept) / total, len(kept) / appended


async def fill(store: Store, count: int) -> str:
    """A channel of `count` lines with synthetic unit vectors, written in bulk."""
    record, _ = await store.get_or_create_agent(memory_key(CHANNEL), ())
    rng = np.random.default_rng(11)
    start = datetime.now(UTC) - timedelta(days=60)
    for first in range(0, count, BULK):
        batch = [as_message(line) for line in lines(min(BULK, count - first), start, seed=first)]
        for n, message in enumerate(batch):
            message.event_id = f"b{first + n}"
        stored = await store.append_messages(record.id, batch)
        vectors = rng.standard_normal((len(stored), DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        await store.set_message_embeddings(record.id, {m.seq: v.tolist() for m, v in zip(stored, vectors, strict=True)})
    return record.id


async def search_times(store: Store, embedder: Embedder, rounds: int) -> tuple[float, list[float]]:
    recall = RecallMemory(store, embedder)
    channels = ChannelMemory(store, recall)
    started = time.perf_counter()
    await channels.search(CHANNEL, QUERIES[0], 10)
    first = time.perf_counter() - started
    times = []
    for n in range(rounds):
        started = time.perf_counter()
        page = await channels.search(CHANNEL, QUERIES[n % len(QUERIES)], 10)
        times.append(time.perf_counter() - started)
        assert page.items and all(line.channel == CHANNEL for line in page.items)
    await recall.close()
    return first, times


async def run(args: argparse.Namespace, folder: Path, mongodb: str, backend: str) -> None:
    embedder = Embedder()
    kept = lines(args.keep, datetime.now(UTC) - timedelta(days=1))
    texts = [as_message(line).said_text() for line in kept]
    embedder.encode_now(texts[:BATCH])  # the model loaded and warm (a full batch) before any clock starts
    before = bare_rate(embedder, texts)
    store = await open_store(folder, mongodb)
    try:
        rate, appends = await keep_rate(store, embedder, kept)
    finally:
        await drop(store)
    after = bare_rate(embedder, texts)
    bare = (before + after) / 2
    print(f"[{backend}] keep {args.keep} lines: {rate:.0f} lines/s kept and embedded ({appends:.0f}/s appends alone)")
    print(f"[{backend}] bare embedding: {bare:.0f} lines/s (before {before:.0f}, after {after:.0f})")
    print(f"[{backend}] kept / bare: {rate / bare:.2f}")

    store = await open_store(folder, mongodb)
    try:
        started = time.perf_counter()
        await fill(store, args.lines)
        filled = time.perf_counter() - started
        first, times = await search_times(store, embedder, args.rounds)
    finally:
        await drop(store)
    times_ms = sorted(1000 * t for t in times)
    p95 = times_ms[max(0, int(0.95 * len(times_ms)) - 1)]
    print(
        f"[{backend}] search a channel of {args.lines} lines (filled in {filled:.1f} s): first {1000 * first:.0f} ms, "
        f"then p50 {statistics.median(times_ms):.1f} ms, p95 {p95:.1f} ms over {args.rounds} searches"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=int, default=2_000, help="lines kept for the keep rate")
    parser.add_argument("--lines", type=int, default=10_000, help="lines in the searched channel")
    parser.add_argument("--large", action="store_true", help="search a channel of 100,000 lines")
    parser.add_argument("--rounds", type=int, default=50, help="searches timed")
    parser.add_argument("--mongodb", default="", help="a MongoDB URI: run on MongoDB too")
    parser.add_argument(
        "--ferretdb", action="store_true", help="start FerretDB (tests/mongo_server.py) and run on it too"
    )
    parser.add_argument("--postgres", action="store_true", help="FerretDB on PostgreSQL rather than SQLite")
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite store's run")
    args = parser.parse_args()
    if args.large:
        args.lines = 100_000
    print(f"machine: {machine()}", flush=True)
    server = postgres = None
    mongodb, backend = args.mongodb, "mongodb"
    if args.ferretdb and not mongodb:
        from tests.mongo_server import FERRETDB_VERSION, FerretDB, find_or_build_ferretdb

        url = ""
        if args.postgres:
            from bench.postgres_server import PostgreSQL

            postgres = PostgreSQL()
            url = postgres.start()
        server = FerretDB(find_or_build_ferretdb(), url)
        mongodb = server.start()
        backend = f"ferretdb {FERRETDB_VERSION} on {'postgresql' if args.postgres else 'sqlite'}"
    try:
        with tempfile.TemporaryDirectory() as folder:
            if not args.no_sqlite:
                asyncio.run(run(args, Path(folder), "", "sqlite"))
            if mongodb:
                asyncio.run(run(args, Path(folder), mongodb, backend))
    finally:
        if server is not None:
            server.stop()
        if postgres is not None:
            postgres.stop()


if __name__ == "__main__":
    main()
