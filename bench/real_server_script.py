"""A 30-message conversation with SmolLM2-135M-Instruct through real local
servers (llama.cpp's llama-server, llama-cpp-python's server), as issue 21
measured it: the whole runtime, a 2,560-token context, a recording proxy
between bot and server (tests/real_llm_servers.py).

Per server it prints: messages answered by the model / sent (and how many got
only a trouble note), requests refused by the server, agents left broken (the
agent cannot answer one more message after the script), requests over the
server's own context, seconds per message, summaries, and the ratio of the
server's prompt tokens to the bot's tiktoken count of the same requests.

    python bench/real_server_script.py                    # both servers
    python bench/real_server_script.py --server llama-server --messages 10

The servers must be built first: scripts/install_llama_server.sh,
scripts/install_llama_cpp_python.sh, scripts/install_smollm2.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.step_time import machine
from bot.config import Settings
from bot.events import UserMessage
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.tokens import TokenCounter, load_encoder
from tests.fake_llm import is_summary_request
from tests.real_llm_servers import (
    MODEL_ALIAS,
    SERVER_KINDS,
    RealServer,
    RecordingProxy,
    bot_environment,
    over_context,
    prompt_counts,
    refused,
)

# Plain chat, facts to keep, runs of digits (tokenized very differently by
# SmolLM2's tokenizer and tiktoken), questions about what was said, and a few
# long messages, so the 2,560-token queue fills and is summarized.
SCRIPT = [
    "Hi there! My name is Dana and I live in Lisbon.",
    "I work night shifts as a nurse at Santa Maria hospital.",
    "My order number is 4815162342 and my locker code is 90210-7731.",
    "Can you remember that my sister Ines turns 31 on 14 March?",
    "What do you know about me so far?",
    "I have a cat called Miso who likes to sleep on my keyboard.",
    "Yesterday I walked 12,480 steps along the river to Belem and back.",
    "Do you think I should learn Spanish or Italian next?",
    "My phone number is +351 912 345 678, please keep it safe.",
    "I'm planning a trip to Porto on 2024-05-17 with my friend Rui.",
    "Tell me a short joke about cats.",
    "What is my sister's name?",
    "Last week I read a long novel about a lighthouse keeper who spent thirty years alone on an island "
    "off the coast of Scotland, writing letters to a woman he had met only once, at a harbour dance, and "
    "never sent any of them until the very end, when the lighthouse was automated and he had to leave.",
    "I'm allergic to peanuts and shellfish.",
    "Where am I going with Rui, and when?",
    "My favourite band is Radiohead; OK Computer is my favourite album.",
    "The hospital changed my shifts: now Monday, Wednesday and Friday, 22:00 to 08:00.",
    "Numbers again: 3.14159 26535 89793 23846 26433 83279 50288 41971.",
    "What do I do for work?",
    "I started a balcony garden with tomatoes, basil and chillies.",
    "Can you suggest a quick dinner that avoids my allergies?",
    "Miso knocked a plant off the balcony this morning, what a mess.",
    "I'm thinking about adopting a second cat. Good idea?",
    "My mother lives in Coimbra and I visit her every second Sunday.",
    "Here is my shopping list: eggs, oat milk, rice, lentils, spinach, lemons, olive oil, bread, coffee, "
    "tomatoes, garlic, onions, chickpeas, yoghurt, apples, bananas, oranges, pasta, cheese, butter.",
    "What is my cat's name?",
    "Rui cancelled, so the Porto trip moves to June.",
    "Which city does my mother live in?",
    "Thanks for listening tonight.",
    "Goodnight! Talk tomorrow.",
]
CHECK = "Are you still there? Just say hi."


@dataclass
class Measured:
    server: str
    context: int
    messages_sent: int
    answered_by_model: int
    got_a_reply: int
    trouble_notes: int
    step_cap_hits: int
    requests: int
    summaries: int
    refused: int
    over_context: int
    agent_left_broken: bool
    seconds_per_message: float
    median_seconds: float
    max_prompt_tokens: int
    token_ratio: float | None
    refusal_texts: list[str]


async def converse(kind: str, count: int, context: int, max_steps: int, embedder: Embedder) -> Measured:
    server = RealServer(kind, context)
    server.start()
    proxy = RecordingProxy(server.port)
    try:
        with tempfile.TemporaryDirectory(prefix="memgpt-script-") as folder:
            env = bot_environment(proxy.base_url, Path(folder), context, MEMGPT_MAX_STEPS=str(max_steps))
            runtime = await Runtime.create(Settings.from_mapping(env), embedder=embedder)
            answered = got_reply = trouble = capped = 0
            seconds: list[float] = []
            try:
                for n, text in enumerate(SCRIPT[:count], start=1):
                    started = time.perf_counter()
                    result = await runtime.handle_with_details(
                        UserMessage(platform="terminal", user_id="dana", text=text)
                    )
                    seconds.append(time.perf_counter() - started)
                    said = " ".join(r.text for r in result.replies).strip()
                    got_reply += bool(said)
                    trouble += result.trouble is not None
                    answered += bool(said) and result.trouble is None
                    capped += result.hit_step_cap
                    print(f"  {kind} {n:>2} {seconds[-1]:6.1f} s  {result.steps} steps  {said[:100]!r}", flush=True)
                since = len(proxy.exchanges)
                check = await runtime.handle_with_details(UserMessage(platform="terminal", user_id="dana", text=CHECK))
                broken = check.trouble is not None or not any(e.status == 200 for e in proxy.completions(since))
            finally:
                await runtime.close(close_embedder=False)
        completions = proxy.completions()
        counter = TokenCounter(load_encoder(MODEL_ALIAS))
        context_size = server.context_size() if server.process is not None else context
        counts = prompt_counts(completions, counter)
        return Measured(
            server=kind,
            context=context_size,
            messages_sent=len(seconds),
            answered_by_model=answered,
            got_a_reply=got_reply,
            trouble_notes=trouble,
            step_cap_hits=capped,
            requests=len(completions),
            summaries=sum(1 for e in completions if e.request is not None and is_summary_request(e.request)),
            refused=len(refused(completions)),
            over_context=len(over_context(completions, server)),
            agent_left_broken=broken,
            seconds_per_message=statistics.fmean(seconds),
            median_seconds=statistics.median(seconds),
            max_prompt_tokens=max((int(e.usage.get("prompt_tokens") or 0) for e in completions), default=0),
            token_ratio=counts.server / counts.with_tools if counts.with_tools else None,
            refusal_texts=sorted({f"{e.status}: {e.error[:160]}" for e in refused(completions)}),
        )
    finally:
        proxy.close()
        server.stop()


async def run(args: argparse.Namespace) -> list[Measured]:
    embedder = Embedder()
    try:
        return [await converse(kind, args.messages, args.context, args.max_steps, embedder) for kind in args.server]
    finally:
        await embedder.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", nargs="*", choices=SERVER_KINDS, default=list(SERVER_KINDS))
    parser.add_argument("--messages", type=int, default=len(SCRIPT))
    parser.add_argument("--context", type=int, default=2560)
    parser.add_argument("--max-steps", type=int, default=8, help="MEMGPT_MAX_STEPS (the default)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    print(f"\nSmolLM2-135M-Instruct Q4_1, context {args.context}; machine: {machine()}")
    for row in rows:
        ratio = f"{row.token_ratio:.3f}" if row.token_ratio else "-"
        print(
            f"{row.server}: answered {row.answered_by_model}/{row.messages_sent} (a reply to {row.got_a_reply}, "
            f"trouble notes {row.trouble_notes}, step cap {row.step_cap_hits}); requests {row.requests} "
            f"({row.summaries} summaries), refused {row.refused}, over the server's context {row.over_context} "
            f"(largest prompt {row.max_prompt_tokens} of {row.context}); agent left broken: "
            f"{'yes' if row.agent_left_broken else 'no'}; {row.seconds_per_message:.1f} s per message "
            f"(median {row.median_seconds:.1f}); server/tiktoken prompt tokens {ratio}"
        )
        for text in row.refusal_texts:
            print(f"    refused: {text}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
