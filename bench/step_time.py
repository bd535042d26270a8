"""Framework time per agent step with an instant LLM, and the fixed prompt size.

The LLM is the local scripted test server answering at once. In the same run
we time the bare openai client's round trip to that server (the floor no
framework can beat) and report framework time = step time - floor, so the
figure holds on a noisy shared machine.

    python bench/step_time.py [--steps 400] [--window 8192]
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
from tests.fake_llm import is_summary_request, reply_text, reply_tool_calls, start_fake_llm, tool_call


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, {platform.platform()}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bare_round_trips(client: openai.AsyncOpenAI, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await client.chat.completions.create(model="bench", messages=[{"role": "user", "content": "hi"}])
        times.append((time.perf_counter() - start) * 1000)
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--window", type=int, default=8_192)
    args = parser.parse_args()

    server = start_fake_llm()
    server.set_handler(
        lambda request: (
            reply_text("A short summary of the conversation so far.")
            if is_summary_request(request)
            else reply_tool_calls(tool_call("send_message", {"message": "ok"}))
        )
    )
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            openai_api_key="bench",
            model="bench-model",
            context_window=args.window,
            data_dir=Path(data_dir),
            llm_max_retries=0,
            # The limits are checked and counted on every event (their cost is
            # part of a step) but set too high to ever hold one back.
            rate_limit_per_minute=10**9,
            daily_token_budget=10**15,
        )
        llm = LLMClient(settings.model, api_key="bench", base_url=server.base_url, max_retries=0)
        runtime = await Runtime.create(
            settings, store=SQLiteStore(Path(data_dir) / "bench.sqlite3"), llm=llm, embedder=Embedder()
        )
        agent = await runtime.agent("terminal:bench")
        fixed = agent.queue.fixed_tokens
        counter = runtime.services.counter
        instructions = counter.count(runtime.services.instructions)
        schemas = counter.count_tools(runtime.services.functions.schemas)

        bare = openai.AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
        await bare_round_trips(bare, 50)  # warm-up
        for i in range(50):
            await runtime.handle(UserMessage(platform="terminal", user_id="bench", text=f"warm {i}"))

        # Also time the LLM call from inside, to subtract exactly the call's own time.
        in_llm = [0.0]
        original = llm.complete

        async def timed_complete(*call_args, **call_kwargs):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return await original(*call_args, **call_kwargs)
            finally:
                in_llm[0] += (time.perf_counter() - started) * 1000

        llm.complete = timed_complete  # type: ignore[method-assign]
        floor: list[float] = []
        steps: list[float] = []
        outside_llm: list[float] = []
        # Interleave the two measurements so machine noise hits both alike.
        for i in range(args.steps):
            floor += await bare_round_trips(bare, 1)
            in_llm[0] = 0.0
            start = time.perf_counter()
            await runtime.handle(UserMessage(platform="terminal", user_id="bench", text=f"message number {i}"))
            steps.append((time.perf_counter() - start) * 1000)
            outside_llm.append(steps[-1] - in_llm[0])
        await runtime.close()
        await bare.close()
    server.stop()

    framework = [step - statistics.median(floor) for step in steps]
    print(f"machine: {machine()}")
    print(f"encoding: {counter.encoding_name}; window {args.window}; {args.steps} one-step events")
    print(
        f"fixed prompt: {fixed} tokens (instructions {instructions}, function schemas {schemas}); "
        f"target <= 1200 (issue 39), Letta 0.11.7 ~3300 -> ratio {fixed / 3300:.2f}"
    )
    print(f"bare openai round trip (floor): median {statistics.median(floor):.2f} ms, p95 {pct(floor, 0.95):.2f} ms")
    print(f"agent step (event -> reply):   median {statistics.median(steps):.2f} ms, p95 {pct(steps, 0.95):.2f} ms")
    print(
        f"framework time per step:       median {statistics.median(framework):.2f} ms, "
        f"p95 {pct(framework, 0.95):.2f} ms; target <= 5 ms, Letta ~170 ms -> ratio "
        f"{statistics.median(framework) / 170:.3f}"
    )
    print(
        f"time outside the LLM call:     median {statistics.median(outside_llm):.2f} ms, "
        f"p95 {pct(outside_llm, 0.95):.2f} ms (storage, token counting, prompt compilation, functions)"
    )


if __name__ == "__main__":
    asyncio.run(main())
