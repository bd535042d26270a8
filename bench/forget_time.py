"""How long a selective forget takes on a large agent.

One agent holds --messages messages (LoCoMo dev turns, repeated a year apart)
and --passages passages (the same turns as archival passages), every one
embedded, on SQLite (MongoDB too with --mongodb URI). A topic is planted in
20 messages, 10 passages, a working-context line and the DM summary. Timed:
the preview (finding what the topic matches, what `/forget about:` shows)
and the whole forget (found again, deleted, the summary rewritten by the
local scripted LLM server, the store flushed), each with its receipt.

    python bench/forget_time.py [--data DIR] [--messages 10000] [--passages 10000] [--mongodb URI]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.locomo_data import DEFAULT_DATA, load
from bot.config import Settings
from bot.forgetting.service import find_about, forget_about
from bot.llm import LLMClient
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.places import DM
from memory.store import Store
from memory.types import Block, Message, Passage, utc_now
from tests.fake_llm import reply_text, start_fake_llm

TOPIC = "my diagnosis, hypothyroidism"
PLANTED = "I was diagnosed with hypothyroidism and take levothyroxine every morning."


def history(size: int, data: Path) -> list[Message]:
    conversations = load(data)
    messages: list[Message] = []
    copy = 0
    while len(messages) < size:
        shift = timedelta(days=366 * copy)
        for conversation in conversations:
            messages.extend(replace(m, created_at=m.created_at + shift) for m in conversation.messages())
        copy += 1
    messages = sorted(messages[:size], key=lambda m: m.created_at)
    for n in range(20):  # the topic, spread over the history
        messages[(n + 1) * size // 21] = replace(messages[(n + 1) * size // 21], content=f"Caroline: {PLANTED}")
    return messages


async def open_store(folder: Path, mongodb: str | None) -> Store:
    if mongodb:
        from memory.mongo.store import MongoStore

        return MongoStore(mongodb, f"forget_bench_{uuid.uuid4().hex[:12]}")
    from memory.sqlite.store import SQLiteStore

    return SQLiteStore(folder / "bench.sqlite3")


async def run(args: argparse.Namespace, folder: Path) -> None:
    server = start_fake_llm()
    server.set_handler(lambda request: reply_text("The person works as a nurse. They love hiking."))
    settings = Settings(openai_api_key="bench", model="bench-model", data_dir=folder, llm_max_retries=0)
    llm = LLMClient(settings.model, api_key="bench", base_url=server.base_url, max_retries=0)
    store = await open_store(folder, args.mongodb)
    runtime = await Runtime.create(settings, store=store, llm=llm, embedder=Embedder())
    try:
        messages = history(args.messages, args.data)
        agent = await runtime.agent("terminal:bench")
        started = time.perf_counter()
        for start in range(0, len(messages), 1000):
            await store.append_messages(agent.id, messages[start : start + 1000])
        await runtime.recall.embed_all(agent.id)
        texts = [m.content or "" for m in history(args.passages, args.data)]
        for n in range(10):
            texts[(n + 1) * len(texts) // 11] = f"Caroline has hypothyroidism ({n}); she takes levothyroxine."
        for start in range(0, len(texts), 1000):
            await runtime.archival.insert(agent.id, [Passage(text) for text in texts[start : start + 1000]])
            await runtime.archival.settle(agent.id)
        human = Block("human", "Works as a nurse.\nDiagnosed with hypothyroidism.\nLoves hiking.", 2000)
        await store.save_block(agent.id, human)
        summary = "The person works as a nurse. The person has hypothyroidism. They love hiking."
        await store.update_queue(agent.id, summary, messages[-1].seq + 1, utc_now(), place=DM.key)
        print(f"set-up (embedding included): {time.perf_counter() - started:.0f} s", flush=True)

        started = time.perf_counter()
        found = await find_about(runtime.services, agent.id, TOPIC)
        preview = time.perf_counter() - started
        print(f"preview: {preview * 1000:.0f} ms, found {found.counts()}", flush=True)

        started = time.perf_counter()
        _, receipt = await forget_about(runtime.services, agent.record, TOPIC)
        whole = time.perf_counter() - started
        print(f"forget (found again, deleted, summary rewritten): {whole * 1000:.0f} ms; {receipt.text()}", flush=True)
        left = await runtime.recall.search(agent.id, "hypothyroidism", 10)
        print(f"a search for the topic afterwards: {sum('hypothyroid' in (m.content or '') for m in left.items)} hits")
        backend = "MongoDB" if args.mongodb else "SQLite"
        print(f"({backend}, {args.messages:,} messages, {args.passages:,} passages)")
    finally:
        client = getattr(store, "_client", None)
        if args.mongodb and client is not None:
            await client.drop_database(getattr(store, "database", ""))
        await runtime.close()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the LoCoMo dev split's folder")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--passages", type=int, default=10_000)
    parser.add_argument("--mongodb", help="run on this MongoDB instead of SQLite (a database, dropped after)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(run(args, Path(folder)))


if __name__ == "__main__":
    main()
