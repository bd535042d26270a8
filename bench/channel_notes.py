"""The extra prompt tokens a channel answer carries because of channel notes.

The same 20 channel messages of one person, through the real runtime (SQLite,
the bot's tokenizer) and the local scripted model (one send_message step per
message), in four runs that differ only in the channel's notes:

- none: the workspace is unknown, so no channel block at all (the prompt before issue 38);
- empty: the channel block with no notes yet;
- typical: eight notes (~600 characters) written before the first message;
- changed: the typical notes, and another member's agent adds a note after the
  10th message: until this person's queue is next cut, each request carries
  that line with the memory status (the system message keeps its cached text).

For each run: prompt tokens per request (tools, then every message, counted as
the bot counts them), the extra over `none`, and the share of that extra in
the part a provider's prompt cache can serve (everything before the newest
message).

    python bench/channel_notes.py [--messages 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.load_throughput import machine
from bot.config import Settings
from bot.events import UserMessage
from bot.llm import LLMClient
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.places import Place
from memory.sqlite.store import SQLiteStore
from tests.fake_llm import is_summary_request, reply_text, reply_tool_calls, start_fake_llm, tool_call

GENERAL = Place("public", "C100", "#general")
CHANNEL = "slack:T1:C100"
NOTES = [
    ("alice", "the launch moved to June 3; code name Zephyr"),
    ("bob", "slides for the launch review are due Friday"),
    ("carol", "the staging server is staging-2, not staging-1"),
    ("alice", "standup moves to 9:30 on Tuesdays and Thursdays"),
    ("dave", "budget questions go to Erin, not to the channel"),
    ("bob", "the design doc lives in the team drive under Launch/2025"),
    ("erin", "expense reports close on the 25th of each month"),
    ("carol", "new members: read the pinned onboarding checklist first"),
]


def scripted(request: dict[str, Any]) -> Any:
    if is_summary_request(request):
        return reply_text("Summary of the chat so far.")
    return reply_tool_calls(tool_call("send_message", {"message": "Noted, thanks."}))


async def write_notes(runtime: Runtime, notes: list[tuple[str, str]]) -> None:
    channel_notes = runtime.services.channel_notes
    assert channel_notes is not None
    for name, text in notes:
        await channel_notes.edit(
            CHANNEL, lambda c, text=text: c.append("channel", text, GENERAL), GENERAL, f"slack:T1:U{name}", name
        )


async def run(kind: str, messages: int, embedder: Embedder, folder: Path) -> tuple[list[int], list[int]]:
    """Prompt tokens of each request, and of its part before the newest message."""
    server = start_fake_llm()
    server.set_handler(scripted)
    settings = Settings(model="gpt-4o-mini", openai_api_key="bench", context_window=8_192, data_dir=folder / kind)
    settings.rate_limit_per_minute = settings.daily_token_budget = 0
    settings.debounce_seconds = 0.0
    llm = LLMClient(settings.model, api_key="bench", base_url=server.base_url, max_retries=0)
    store = SQLiteStore(folder / f"{kind}.sqlite3")
    runtime = await Runtime.create(settings, store=store, llm=llm, embedder=embedder)
    counter = runtime.services.counter
    try:
        if kind in ("typical", "changed"):
            await write_notes(runtime, NOTES)
        for n in range(messages):
            if kind == "changed" and n == messages // 2:
                await write_notes(runtime, [("frank", "the launch party is at the harbour cafe, 6 pm")])
            workspace = "" if kind == "none" else "T1"
            text = f"Message {n}: how is the launch going on your side?"
            await runtime.handle(
                UserMessage(
                    platform="slack",
                    user_id="T1:Ubob",
                    display_name="bob",
                    text=text,
                    place=GENERAL,
                    workspace=workspace,
                )
            )
        totals, prefixes = [], []
        for request in server.requests:
            if is_summary_request(request):
                continue
            tools = counter.count(json.dumps(request.get("tools") or []))
            parts = [counter.count(json.dumps(m, ensure_ascii=False)) for m in request["messages"]]
            totals.append(tools + sum(parts))
            prefixes.append(tools + sum(parts[:-1]))
        return totals, prefixes
    finally:
        await runtime.close(close_embedder=False)
        server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20)
    args = parser.parse_args()
    embedder = Embedder()
    print(f"machine: {machine()}")
    notes_chars = len("\n".join(f"{name}: {text}" for name, text in NOTES))
    print(f"{args.messages} channel messages per run; typical notes: {len(NOTES)} lines, {notes_chars} characters")
    with tempfile.TemporaryDirectory() as folder:
        runs = {
            kind: await run(kind, args.messages, embedder, Path(folder))
            for kind in ("none", "empty", "typical", "changed")
        }
    base_total, base_prefix = runs["none"]
    print("| notes | tokens per request (mean) | extra per request | of it in the cacheable prefix |")
    print("|---|---|---|---|")
    for kind, (totals, prefixes) in runs.items():
        extra = [t - b for t, b in zip(totals, base_total, strict=True)]
        cached = [p - b for p, b in zip(prefixes, base_prefix, strict=True)]
        mean_extra = sum(extra) / len(extra)
        share = sum(cached) / sum(extra) if sum(extra) else 1.0
        print(f"| {kind} | {sum(totals) / len(totals):.0f} | {mean_extra:+.1f} | {100 * share:.0f}% |")
    await embedder.close()


if __name__ == "__main__":
    asyncio.run(main())
