"""Events per second across many users in one process, with an instant LLM,
and the process's memory after warm-up.

The scripted LLM server runs in a separate process so its CPU does not count
against the bot's. Baselines in the same run: the bare openai client's request
rate against the same server with the same concurrency, with its default httpx
transport (what a framework built on the SDK gets out of the box) and with the
SDK's aiohttp transport the bot uses (the ceiling for the bot's own work), so
the figure reads as ratios.

    python bench/throughput.py [--users 1000] [--events 5000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import openai

from bot.config import Settings
from bot.events import UserMessage
from bot.llm import LLMClient
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.sqlite.store import SQLiteStore


def serve(port_queue: multiprocessing.Queue, stop: multiprocessing.Event) -> None:  # type: ignore[type-arg]
    from tests.fake_llm import is_summary_request, reply_text, reply_tool_calls, start_fake_llm, tool_call

    server = start_fake_llm()
    server.set_handler(
        lambda request: (
            reply_text("A short summary.")
            if is_summary_request(request)
            else reply_tool_calls(tool_call("send_message", {"message": "ok"}))
        )
    )
    server.keep_requests = False
    port_queue.put(server.base_url)
    stop.wait()
    server.stop()


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def bare_rate(base_url: str, requests: int, concurrency: int, *, aiohttp: bool = False) -> tuple[float, float]:
    """Requests per second, and CPU milliseconds per request in this process, of the
    bare openai client: with its default httpx transport, or (`aiohttp`) with the
    SDK's aiohttp transport, which the bot uses (bot/llm/client.py)."""
    http_client = openai.DefaultAioHttpClient() if aiohttp else None
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, http_client=http_client)
    semaphore = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with semaphore:
            await client.chat.completions.create(model="bench", messages=[{"role": "user", "content": "hi"}])

    start, cpu_start = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one() for _ in range(requests)))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    await client.close()
    return requests / elapsed, cpu * 1000 / requests


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--load-model", action="store_true", help="load the embedding model first (memory figure)")
    args = parser.parse_args()

    port_queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    stop = multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(port_queue, stop), daemon=True)
    server.start()
    base_url = port_queue.get(timeout=30)

    embedder = Embedder()
    if args.load_model:
        await embedder.warm_up()
        await embedder.embed(["warm up the embedding model"])
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            openai_api_key="bench",
            model="bench-model",
            context_window=8_192,
            data_dir=Path(data_dir),
            llm_max_retries=0,
            # Checked and counted on every event, too high to ever hold one back.
            rate_limit_per_minute=10**9,
            daily_token_budget=10**15,
        )
        llm = LLMClient(settings.model, api_key="bench", base_url=base_url, max_retries=0)
        runtime = await Runtime.create(
            settings, store=SQLiteStore(Path(data_dir) / "bench.sqlite3"), llm=llm, embedder=embedder
        )
        semaphore = asyncio.Semaphore(args.concurrency)
        rng = random.Random(7)

        async def one(i: int, user: int) -> None:
            async with semaphore:
                await runtime.handle(UserMessage(platform="slack", user_id=f"T1:U{user}", text=f"message {i}"))

        # Warm-up: every user's agent exists and has some history.
        await asyncio.gather(*(one(i, user) for i, user in enumerate(range(args.users))))
        warm_rss = rss_mb()
        baseline, baseline_cpu_ms = await bare_rate(base_url, min(args.events, 3_000), args.concurrency)
        same_transport, same_transport_cpu_ms = await bare_rate(
            base_url, min(args.events, 3_000), args.concurrency, aiohttp=True
        )
        # process_time counts every thread of this process: the SQLite workers too.
        start, cpu_start = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i, rng.randrange(args.users)) for i in range(args.events)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        after_rss = rss_mb()
        await runtime.close()
    stop.set()
    server.join(timeout=10)

    rate = args.events / elapsed
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}")
    print(f"{args.users} users, {args.events} events, concurrency {args.concurrency}, instant LLM in another process")
    print(f"bare openai client (default httpx transport): {baseline:.0f} requests/s, {baseline_cpu_ms:.2f} CPU ms each")
    print(
        f"bare openai client (aiohttp transport, as the bot): {same_transport:.0f} requests/s, "
        f"{same_transport_cpu_ms:.2f} CPU ms each"
    )
    print(
        f"bot: {rate:.0f} events/s (target >= 500) -> {rate / baseline:.2f} of the bare default client's rate "
        f"(target >= 0.8), {rate / same_transport:.2f} of the same-transport client's"
    )
    print(f"bot CPU: {cpu * 1000 / args.events:.2f} ms per event (all threads of the bot process)")
    print(
        f"memory (RSS): {warm_rss:.0f} MB after warm-up, {after_rss:.0f} MB after the run "
        f"(embedding model {'loaded' if args.load_model else 'not loaded'}; target <= 550 MB with it)"
    )


if __name__ == "__main__":
    asyncio.run(main())
