"""Loading large text files: passages/s against the raw embedding speed, and
peak memory against file size.

For each size (default 20 MB and 2 MB) a text file of varied prose paragraphs
is generated (nothing is downloaded) and loaded end to end by
`memory.ingest.loader.load_paths` (reading, chunking, hashing, embedding,
writing) into a fresh SQLite store, in a child process of its own so that its
peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`: the kernel's
high-water mark of resident memory, the model included) belongs to that
file alone. "Raw" is `Embedder.encode_now` (the model alone, no store) on a
sample of the same file's passages spread over the whole file, measured in
the same child just before and just after the load (the mean of the two, so a
shared machine's drifting load hits both alike). The ratio is printed by wall
time and by CPU time of the process (work done, whatever other processes take
from the machine).

    python bench/load_throughput.py [--megabytes 20 2] [--raw-sample 1024] [--torch-threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memory.ingest.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP_TOKENS, chunk_text
from memory.tokens import TokenCounter, load_encoder

COUNTER_MODEL = "gpt-4o-mini"
WORDS = (
    "the a of to and in garden soil water seed root leaf light frost season harvest compost tomato pepper basil "
    "morning evening plant grows needs when should every week month warm cold shade sun rain dry wet deep "
    "shallow prune feed mulch pest aphid slug bloom flower fruit ripe green yellow careful gently often rarely "
    "river mountain engine letter council market winter history village railway bridge doctor teacher lantern "
    "whisper quarrel harbour ledger orchard timber copper velvet thunder patience journey promise stranger "
    "because although however therefore meanwhile suddenly quietly nearly almost perhaps certainly"
).split()


def machine() -> str:
    load = ", ".join(f"{n:.1f}" for n in os.getloadavg())
    return (
        f"{platform.machine()} {os.cpu_count()} cpus, load average {load}, Python {platform.python_version()}, "
        f"{platform.platform()}"
    )


def write_prose(path: Path, megabytes: float, seed: int) -> None:
    """Paragraphs of 2-9 sentences of 5-28 words, with numbers and names, so
    chunks are realistic long passages (most close to the token limit)."""
    rng = random.Random(seed)
    target = int(megabytes * 1024 * 1024)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        while written < target:
            sentences = []
            for _ in range(rng.randint(2, 9)):
                words = [rng.choice(WORDS) for _ in range(rng.randint(5, 28))]
                if rng.random() < 0.3:
                    words.insert(rng.randrange(len(words)), str(rng.randint(2, 2024)))
                sentences.append(" ".join(words).capitalize() + rng.choice(".....?!"))
            paragraph = " ".join(sentences) + "\n\n"
            out.write(paragraph)
            written += len(paragraph)


def sample_passages(path: Path, size: int) -> tuple[int, list[str]]:
    """How many passages the file chunks into, and `size` of them spread evenly
    over it (all of them with size 0)."""
    counter = TokenCounter(load_encoder(COUNTER_MODEL))
    texts = [c.text for c in chunk_text(path.read_text(encoding="utf-8"), counter, DEFAULT_MAX_TOKENS)]
    if size <= 0 or size >= len(texts):
        return len(texts), texts
    step = len(texts) / size
    return len(texts), [texts[int(n * step)] for n in range(size)]


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- the child: one file, one process ------------------------------------------
async def child(file: Path, texts: list[str], torch_threads: int) -> dict[str, float]:
    from memory.archival import ArchivalMemory
    from memory.embeddings import Embedder
    from memory.ingest.loader import load_paths
    from memory.sqlite.store import SQLiteStore

    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    counter = TokenCounter(load_encoder(COUNTER_MODEL))
    embedder = Embedder()
    await embedder.warm_up()
    embedder.encode_now(texts[:64])  # the model's first calls are slow

    def raw() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        embedder.encode_now(texts)
        return time.perf_counter() - wall, time.process_time() - cpu

    ready_rss = rss_mib()
    raw_before = raw()
    store = SQLiteStore(file.with_suffix(".sqlite3"))
    await store.open()
    agent, _ = await store.get_or_create_agent("bench:loader", [])
    wall, cpu = time.perf_counter(), time.process_time()
    archival = ArchivalMemory(store, embedder)
    report = await load_paths(
        archival, agent.id, [file], counter=counter, max_tokens=DEFAULT_MAX_TOKENS, progress=False
    )
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    await store.close()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert not report.failed, report.failed
    raw_after = raw()
    await embedder.close()
    raw_wall = len(texts) * 2 / (raw_before[0] + raw_after[0])
    raw_cpu = len(texts) * 2 / (raw_before[1] + raw_after[1])
    return {
        "passages": report.passages_added,
        "seconds": seconds,
        "rate": report.passages_added / seconds,
        "cpu_rate": report.passages_added / cpu_seconds,
        "raw": raw_wall,
        "raw_cpu": raw_cpu,
        "ready_rss": ready_rss,
        "peak_rss": peak_rss,
    }


# -- the parent --------------------------------------------------------------
def run_child(file: Path, sample: Path, torch_threads: int) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", str(file), "--sample-file", str(sample)]
    command += ["--torch-threads", str(torch_threads)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, nargs="+", default=[20.0, 2.0])
    parser.add_argument("--raw-sample", type=int, default=1024, help="passages for the raw speed (0: all)")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads in the child (0: leave)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sample-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        texts = json.loads(args.sample_file.read_text())
        print(json.dumps(asyncio.run(child(args.child, texts, args.torch_threads))))
        return

    print(machine())
    print(f"max {DEFAULT_MAX_TOKENS} tokens, overlap {DEFAULT_OVERLAP_TOKENS}; peak RSS = ru_maxrss of the child")
    print(
        f"\n{'file':>8} {'passages':>9} {'seconds':>8} {'loader p/s':>11} {'raw p/s':>8} {'ratio':>6}"
        f" {'CPU: loader':>11} {'raw':>6} {'ratio':>6} {'RSS ready':>10} {'peak':>8}"
    )
    with tempfile.TemporaryDirectory() as scratch:
        for number, megabytes in enumerate(args.megabytes):
            file = Path(scratch) / f"prose{number}.txt"
            write_prose(file, megabytes, seed=number)
            total, texts = sample_passages(file, args.raw_sample)
            sample = Path(scratch) / f"sample{number}.json"
            sample.write_text(json.dumps(texts))
            r = run_child(file, sample, args.torch_threads)
            assert r["passages"] == total, (r["passages"], total)
            print(
                f"{megabytes:>5.1f} MB {int(r['passages']):>9} {r['seconds']:>8.1f} {r['rate']:>11.1f}"
                f" {r['raw']:>8.1f} {r['rate'] / r['raw']:>6.2f} {r['cpu_rate']:>11.1f} {r['raw_cpu']:>6.1f}"
                f" {r['cpu_rate'] / r['raw_cpu']:>6.2f} {r['ready_rss']:>6.0f} MiB {r['peak_rss']:>4.0f} MiB",
                flush=True,
            )
    print(f"\ntarget: loader/raw >= 0.90; {machine()}")


if __name__ == "__main__":
    main()
