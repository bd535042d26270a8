"""Document QA through the agent: load a document collection into archival
storage, ask questions, and count accuracy, searches and pages read.

    python bench/doc_qa.py --base-url URL --model NAME [--docs DIR --questions FILE.jsonl]
    python bench/doc_qa.py --scripted        # the harness itself, against the local test model

--docs holds .md / .txt files; --questions holds one JSON object per line,
{"question": "...", "answer": "..."}: an answer counts as right when a reply
contains the expected text (case and spacing aside). Without them a small
built-in synthetic collection and its questions are used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.nested_kv import count_calls, last_event
from bot.events import UserMessage
from bot.runtime import Runtime
from memory.ingest.chunking import chunk_text
from memory.types import Passage

DOCUMENTS: dict[str, str] = {
    "observatory-handbook.md": """# Halden Ridge Observatory handbook

## Access
The main dome opens at 19:30 on clear nights. Visitors enter through the north gate; the south gate is
for staff vehicles only. The access code for the equipment room is 7734-KESTREL and changes every quarter.

## Telescopes
The largest instrument is a 1.2 metre Ritchey-Chretien reflector named Aurelia, installed in 2011.
A smaller 40 centimetre refractor, Bellwether, is used for public nights. Aurelia's mirror is realuminised
every four years by a contractor from Tromso.

## Safety
Red torches only inside the domes. In a power cut the dome shutters close on battery power within 90 seconds.
The nearest hospital is in Vasslia, 38 kilometres away.
""",
    "espresso-manual.md": """# Corvina E-61 espresso machine manual

## Setting up
Fill the reservoir with soft water; hard water scales the boiler. The boiler holds 1.8 litres and reaches
brewing temperature after about 25 minutes.

## Daily care
Backflush the group head with plain water after the last shot of the day. Once a week, backflush with
detergent tablets of type CR-12. Never use vinegar: it damages the gaskets.

## Troubleshooting
A blinking amber light means the reservoir is empty. If the pump hums but no water flows, the intake
filter is blocked: rinse it under warm water. Error code E7 means the temperature probe has failed and
must be replaced by a technician.
""",
    "library-policies.md": """# Riverbend Community Library policies

## Borrowing
Members may borrow up to twelve items at once. Books are lent for three weeks, films for one week.
A loan can be renewed twice unless another member has reserved the item.

## Fees
Late returns cost 20 cents per day per item, capped at 6 euros per item. Lost items are charged at
their replacement price plus a 4 euro processing fee.

## Rooms
The Larch meeting room seats sixteen people and can be booked up to two months ahead. The quiet study
room on the second floor is reserved for members over sixteen during exam weeks.
""",
}

QUESTIONS: list[dict[str, str]] = [
    {"question": "What is the code for the equipment room at the observatory?", "answer": "7734-KESTREL"},
    {"question": "What is the name of the big reflector telescope?", "answer": "Aurelia"},
    {"question": "How far away is the closest hospital from the observatory?", "answer": "38 kilometres"},
    {"question": "Which detergent tablets should I use to clean the coffee machine weekly?", "answer": "CR-12"},
    {"question": "What does error E7 on the espresso machine mean?", "answer": "temperature probe"},
    {"question": "How long until the espresso boiler is hot enough?", "answer": "25 minutes"},
    {"question": "How many items can a library member borrow at the same time?", "answer": "twelve"},
    {"question": "What is the most I can be charged in late fees for one book?", "answer": "6 euros"},
    {"question": "How many people fit in the Larch room?", "answer": "sixteen"},
]


@dataclass(slots=True)
class QAResult:
    question: str
    answer: str
    correct: bool
    searches: int
    pages: int
    steps: int
    reply: str = ""


@dataclass(slots=True)
class QAReport:
    results: list[QAResult] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return sum(r.correct for r in self.results) / max(len(self.results), 1)

    def mean(self, name: str) -> float:
        return sum(getattr(r, name) for r in self.results) / max(len(self.results), 1)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def read_collection(docs: Path | None, questions: Path | None) -> tuple[dict[str, str], list[dict[str, str]]]:
    documents = DOCUMENTS
    if docs is not None:
        files = [p for p in sorted(docs.iterdir()) if p.suffix in {".md", ".markdown", ".txt"}]
        documents = {p.name: p.read_text(errors="replace") for p in files}
    asked = QUESTIONS
    if questions is not None:
        asked = [json.loads(line) for line in questions.read_text().splitlines() if line.strip()]
    return documents, asked


async def load_documents(runtime: Runtime, agent_key: str, documents: dict[str, str]) -> str:
    agent = await runtime.agent(agent_key)
    passages = [
        Passage(text=chunk.text, source=name, position=chunk.position or None)
        for name, text in documents.items()
        for chunk in chunk_text(text, runtime.services.counter, max_tokens=96, overlap_tokens=16)
    ]
    await runtime.archival.insert(agent.id, passages)
    agent.archival_count += len(passages)
    await runtime.archival.settle(agent.id)
    return agent.id


def prompt(question: str) -> str:
    return f"Answer from the documents in your archival memory, briefly: {question}"


async def run_agent(
    runtime: Runtime,
    documents: dict[str, str],
    questions: Sequence[dict[str, str]],
    *,
    agent_key: str = "bench:doc-qa",
    verbose: bool = False,
) -> QAReport:
    agent_id = await load_documents(runtime, agent_key, documents)
    platform, user = agent_key.split(":", 1)
    report = QAReport()
    for item in questions:
        before = await runtime.store.count_messages(agent_id)
        result = await runtime.handle_with_details(
            UserMessage(platform=platform, user_id=user, text=prompt(item["question"]))
        )
        produced = await runtime.store.messages_since(agent_id, before + 1)
        searches, pages = count_calls(produced, "archival_memory_search")
        reply = " | ".join(r.text for r in result.replies)
        correct = _norm(item["answer"]) in _norm(reply)
        report.results.append(QAResult(item["question"], item["answer"], correct, searches, pages, result.steps, reply))
        if verbose:
            print(f"  {'ok ' if correct else 'MISS'} {searches} searches, {pages} pages: {item['question']}")
    return report


# -- the local scripted model (tests and --scripted) -------------------------------
def scripted_call(request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Search the question, read the second page too when there is one, then
    answer with the best passage of the first page."""
    messages = request["messages"]
    last = last_event(messages)
    if last["role"] != "tool":
        query = (last.get("content") or "").split("briefly:", 1)[-1].strip()
        return "archival_memory_search", {"query": query, "request_heartbeat": True}
    pages = [json.loads(m["content"]).get("result", "") for m in messages if m["role"] == "tool"]
    current = pages[-1]
    asked = next(
        json.loads(call["function"]["arguments"]) for m in reversed(messages) for call in (m.get("tool_calls") or [])
    )
    if asked.get("page", 0) == 0 and "call again with page=1" in current:
        return "archival_memory_search", {**asked, "page": 1, "request_heartbeat": True}
    first = next((p for p in reversed(pages) if p.startswith("Page 0")), current)
    # Items start with "- " on a new line; a passage's own text may span lines.
    items = first.split("\n- ")[1:]
    best = items[0] if items else "I found nothing."
    return "send_message", {"message": best}


def scripted_reply(request: dict[str, Any]) -> Any:
    from tests.fake_llm import is_summary_request, reply_text, reply_tool_calls, tool_call

    if is_summary_request(request):
        return reply_text("The user asked questions about the loaded documents.")
    name, args = scripted_call(request)
    return reply_tool_calls(tool_call(name, args))


async def main() -> None:
    from bot.config import Settings
    from bot.llm import LLMClient
    from memory.embeddings import Embedder
    from memory.sqlite.store import SQLiteStore

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url")
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument("--docs", type=Path)
    parser.add_argument("--questions", type=Path)
    parser.add_argument("--scripted", action="store_true", help="use the local scripted test model")
    parser.add_argument("--max-steps", type=int, default=12)
    args = parser.parse_args()
    if not (args.base_url or args.scripted):
        parser.error("give --base-url URL --model NAME, or --scripted")
    documents, questions = read_collection(args.docs, args.questions)

    server = None
    if args.scripted:
        from tests.fake_llm import start_fake_llm

        server = start_fake_llm()
        server.set_handler(scripted_reply)
        args.base_url, args.model = server.base_url, "scripted"
        args.context_window = getattr(args, "context_window", None) or 32_768
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            openai_api_key=args.api_key,
            openai_base_url=args.base_url,
            model=args.model,
            data_dir=Path(data_dir),
            max_steps_per_event=args.max_steps,
            rate_limit_per_minute=0,
            daily_token_budget=0,
        )  # a quality run: no limits
        if getattr(args, "context_window", None):
            settings.context_window = args.context_window
        llm = LLMClient(settings.model, api_key=args.api_key, base_url=args.base_url)
        runtime = await Runtime.create(
            settings, store=SQLiteStore(Path(data_dir) / "doc-qa.sqlite3"), llm=llm, embedder=Embedder()
        )
        started = time.perf_counter()
        try:
            report = await run_agent(runtime, documents, questions, verbose=True)
        finally:
            await runtime.close()
            if server is not None:
                server.stop()
    print(f"document QA ({args.model}): {len(documents)} documents, {len(questions)} questions")
    print(
        f"  accuracy {report.accuracy:.0%}; per question: searches {report.mean('searches'):.1f}, "
        f"pages read {report.mean('pages'):.1f}, steps {report.mean('steps'):.1f}"
    )
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    asyncio.run(main())
