"""Answer quality of the whole agent: LoCoMo's questions asked through the real
runtime against any OpenAI-compatible endpoint.

For each conversation of the LoCoMo dev split (read from ../shared/data/
locomo-dev, never copied here) every turn is imported into one agent's recall
storage, as `memgpt-bot memory import` does (speaker_a as the person, speaker_b
as the agent's side). Each question is then asked by the person, in a fresh
copy of that agent (so no question sees another's answer), and the agent answers
as it would on Discord: its own steps, its own conversation_search calls, its
replies. The reply is scored against the reference answer with token F1
(SQuAD's: lower case, no punctuation or articles) and, with --judge-model, by an
LLM judge (CORRECT / WRONG, as Mem0's LoCoMo evaluation asks). Printed:
accuracy per category, and per question its F1, tokens (the bot's count) and
latency; the machine.

Not run in CI: useful with a capable model. With the tiny local model it only
proves the path works end to end:

    python bench/qa.py --base-url http://127.0.0.1:8080/v1 --model llama3.1 --context-window 8192
    python bench/qa.py --server llama-server --per-category 1      # starts SmolLM2-135M here
    python bench/qa.py ... --judge-model gpt-4o-mini --judge-base-url https://api.openai.com/v1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import string
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import openai

from bench.locomo_data import CATEGORIES, DEFAULT_DATA, Conversation, Question, load
from bench.step_time import machine
from bot.config import Settings
from bot.events import UserMessage
from bot.runtime import Runtime
from memory.embeddings import Embedder
from tests.real_llm_servers import MODEL_ALIAS, SERVER_KINDS, RealServer, bot_environment

PERSON = "person"
JUDGE_PROMPT = """Label an answer to a question about a long conversation as CORRECT or WRONG.
It is CORRECT if it states the same thing as the gold answer (wording, length and extra
detail do not matter; a date or time span that names the same moment counts); otherwise WRONG.

Question: {question}
Gold answer: {gold}
Answer: {answer}

Reply with one word: CORRECT or WRONG."""


# -- scoring -------------------------------------------------------------------
def normalize(text: str) -> list[str]:
    """SQuAD's answer normalization, as words."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return re.sub(r"\b(a|an|the|and)\b", " ", text).split()


def token_f1(answer: str, gold: str) -> float:
    said, wanted = normalize(answer), normalize(gold)
    common = sum((Counter(said) & Counter(wanted)).values())
    if not said or not wanted or not common:
        return float(said == wanted)
    precision, recall = common / len(said), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


async def judge(client: openai.AsyncOpenAI, model: str, question: Question, answer: str) -> bool:
    prompt = JUDGE_PROMPT.format(question=question.text, gold=question.answer, answer=answer or "(no answer)")
    completion = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=5, temperature=0
    )
    return "CORRECT" in (completion.choices[0].message.content or "").upper()


# -- one conversation ----------------------------------------------------------------
@dataclass
class Answered:
    conversation: str
    category: int
    question: str
    gold: str
    answer: str
    f1: float
    judged: bool | None
    tokens: int
    steps: int
    seconds: float
    trouble: bool


def chosen_questions(conversation: Conversation, per_category: int) -> list[Question]:
    picked: list[Question] = []
    for category in CATEGORIES:
        picked += [q for q in conversation.questions if q.category == category][:per_category]
    return picked


async def imported_template(conversation: Conversation, env: dict[str, str], embedder: Embedder) -> None:
    """The data folder of an agent holding the whole conversation in recall storage."""
    runtime = await Runtime.create(Settings.from_mapping(env), embedder=embedder)
    try:
        key = f"terminal:{PERSON}"
        await runtime.import_history(key, conversation.messages())
        record = await runtime.store.find_agent(key)
        assert record is not None
        await runtime.recall.search(record.id, "warm up", 1)  # embeds the imported messages
        await runtime.recall.settle(record.id)
    finally:
        await runtime.close(close_embedder=False)


async def ask(question: Question, env: dict[str, str], embedder: Embedder) -> tuple[str, int, int, float, bool]:
    runtime = await Runtime.create(Settings.from_mapping(env), embedder=embedder)
    try:
        started = time.perf_counter()
        result = await runtime.handle_with_details(UserMessage(platform="terminal", user_id=PERSON, text=question.text))
        seconds = time.perf_counter() - started
    finally:
        await runtime.close(close_embedder=False)
    answer = " ".join(reply.text for reply in result.replies)
    return answer, result.tokens_used, result.steps, seconds, result.trouble is not None


async def run(args: argparse.Namespace, base_url: str, model: str, embedder: Embedder | None = None) -> list[Answered]:
    conversations = [c for c in load(args.data) if not args.conversations or c.name in args.conversations]
    own_embedder = embedder is None
    embedder = embedder or Embedder()
    judge_client = (
        openai.AsyncOpenAI(base_url=args.judge_base_url, api_key=os.environ.get("JUDGE_API_KEY") or args.api_key)
        if args.judge_model
        else None
    )
    answered: list[Answered] = []
    with tempfile.TemporaryDirectory(prefix="memgpt-qa-") as folder:
        for conversation in conversations:
            template = Path(folder) / conversation.name
            settings_env = {
                "OPENAI_API_KEY": args.api_key,
                "MEMGPT_MAX_STEPS": str(args.max_steps),
                "MEMGPT_LOG_LEVEL": "WARNING",
                "MEMGPT_MODEL": model,
            }
            await imported_template(
                conversation, bot_environment(base_url, template, args.context_window, **settings_env), embedder
            )
            for n, question in enumerate(chosen_questions(conversation, args.per_category)):
                data_dir = Path(folder) / f"{conversation.name}-q{n}"
                shutil.copytree(template, data_dir)
                env = bot_environment(base_url, data_dir, args.context_window, **settings_env)
                answer, tokens, steps, seconds, trouble = await ask(question, env, embedder)
                shutil.rmtree(data_dir, ignore_errors=True)
                verdict = await judge(judge_client, args.judge_model, question, answer) if judge_client else None
                row = Answered(
                    conversation.name,
                    question.category,
                    question.text,
                    question.answer,
                    answer,
                    token_f1(answer, question.answer),
                    verdict,
                    tokens,
                    steps,
                    seconds,
                    trouble,
                )
                answered.append(row)
                print(
                    f"  {conversation.name} [{CATEGORIES[row.category]}] F1 {row.f1:.2f}"
                    f"{'' if verdict is None else ' judge ' + ('yes' if verdict else 'no')}"
                    f"  {tokens} tokens, {steps} steps, {seconds:.1f} s  Q: {question.text!r}  A: {answer[:120]!r}",
                    flush=True,
                )
    if own_embedder:
        await embedder.close()
    return answered


def report(rows: list[Answered], model: str) -> None:
    print(f"\nmodel {model}, {len(rows)} questions; machine: {machine()}")
    print(f"{'category':<12} {'n':>3} {'F1':>6} {'judge':>6} {'tokens':>8} {'seconds':>8}")
    for category, name in [*CATEGORIES.items(), (0, "all")]:
        group = [r for r in rows if category in (0, r.category)]
        if not group:
            continue
        judged = [r.judged for r in group if r.judged is not None]
        accuracy = f"{sum(judged) / len(judged):.2f}" if judged else "-"
        print(
            f"{name:<12} {len(group):>3} {statistics.fmean(r.f1 for r in group):>6.3f} {accuracy:>6} "
            f"{statistics.fmean(r.tokens for r in group):>8.0f} {statistics.fmean(r.seconds for r in group):>8.1f}"
        )
    print(f"answers that were a trouble note: {sum(r.trouble for r in rows)} of {len(rows)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="an OpenAI-compatible endpoint (…/v1)")
    where.add_argument("--server", choices=SERVER_KINDS, help="start this local server with SmolLM2-135M")
    parser.add_argument("--model", default=os.environ.get("MEMGPT_MODEL", MODEL_ALIAS))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "local"))
    parser.add_argument("--context-window", type=int, default=8192)
    parser.add_argument("--per-category", type=int, default=2, help="questions per category per conversation")
    parser.add_argument("--conversations", nargs="*", help="e.g. conv-26 (default: all four)")
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--judge-model", help="an LLM that labels answers CORRECT / WRONG")
    parser.add_argument("--judge-base-url", help="its endpoint (default: OpenAI); key in JUDGE_API_KEY")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", type=Path, help="also write every answer here")
    args = parser.parse_args()

    server = None
    if args.server:
        server = RealServer(args.server, args.context_window)
        server.start()
        base_url, model = server.base_url, MODEL_ALIAS
    else:
        base_url, model = args.base_url, args.model
    try:
        rows = asyncio.run(run(args, base_url, model))
    finally:
        if server is not None:
            server.stop()
    report(rows, model)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
