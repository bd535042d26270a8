"""bench/qa.py end to end against the scripted server: a small conversation in
LoCoMo's format is imported into recall, each question is asked by the person
through the real runtime, and the model finds the answer only by searching the
imported turns; the scores are token F1 against the reference."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from bench.locomo_data import load
from bench.qa import chosen_questions, run, token_f1
from memory.embeddings import Embedder
from tests.fake_llm import FakeLLMServer, Reply, is_summary_request, reply_text, reply_tool_calls, tool_call


def test_token_f1_is_squads() -> None:
    assert token_f1("Lisbon", "lisbon.") == 1.0
    assert token_f1("She lives in Lisbon", "Lisbon") == 0.4  # precision 1/4, recall 1
    assert token_f1("the", "a") == 1.0  # both empty after normalization
    assert token_f1("", "Lisbon") == 0.0
    assert token_f1("Porto", "Lisbon") == 0.0


def write_conversation(folder: Path) -> Path:
    turns = [
        {"speaker": "Ana", "dia_id": "D1:1", "text": "I moved to Lisbon last spring."},
        {"speaker": "Rui", "dia_id": "D1:2", "text": "Nice! Do you like it?"},
        {"speaker": "Ana", "dia_id": "D1:3", "text": "Yes, and I adopted a dog named Biscuit."},
    ]
    data = [
        {
            "sample_id": "conv-test",
            "conversation": {
                "speaker_a": "Ana",
                "speaker_b": "Rui",
                "session_1": turns,
                "session_1_date_time": "1:56 pm on 8 May, 2023",
            },
            "qa": [
                {"question": "Which city did Ana move to?", "answer": "Lisbon", "evidence": ["D1:1"], "category": 4},
                {
                    "question": "What is Ana's dog called?",
                    "answer": "Biscuit",
                    "evidence": ["D1:3"],
                    "category": 1,
                },
                {"question": "Ignored: adversarial", "adversarial_answer": "x", "evidence": ["D1:2"], "category": 5},
            ],
        }
    ]
    (folder / "locomo-dev.json").write_text(json.dumps(data), encoding="utf-8")
    return folder


def searching_model(request: dict[str, Any]) -> Reply:
    """Searches recall for the question's key word, then sends what the search found."""
    if is_summary_request(request):
        return reply_text("summary")
    messages = request["messages"]
    results = [m for m in messages if m.get("role") == "tool"]
    if not results:
        question = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
        query = "dog" if "dog" in question else "moved"
        return reply_tool_calls(tool_call("conversation_search", {"query": query, "request_heartbeat": True}))
    found = re.search(r"(Lisbon|Biscuit)", str(results[-1]["content"]))
    return reply_tool_calls(tool_call("send_message", {"message": found.group(1) if found else "I don't know"}))


async def test_qa_asks_each_question_of_a_fresh_agent_holding_the_conversation(
    llm_server: FakeLLMServer, embedder: Embedder, tmp_path: Path
) -> None:
    data = write_conversation(tmp_path)
    (conversation,) = load(data)
    assert [q.category for q in chosen_questions(conversation, 1)] == [1, 4]  # category 5 is not asked
    llm_server.set_handler(searching_model)
    args = argparse.Namespace(
        data=data,
        conversations=None,
        per_category=1,
        api_key="test",
        max_steps=4,
        context_window=8192,
        judge_model=None,
        judge_base_url=None,
    )
    rows = await run(args, llm_server.base_url, "test-model", embedder)

    assert [(row.gold, row.answer, row.f1) for row in rows] == [("Biscuit", "Biscuit", 1.0), ("Lisbon", "Lisbon", 1.0)]
    assert all(row.tokens > 0 and row.steps == 2 and not row.trouble for row in rows)
    # Each question went to an agent that had not seen the other one.
    asked = [
        [m["content"] for m in request["messages"] if m.get("role") == "user" and "?" in str(m.get("content"))]
        for request in llm_server.requests
        if not is_summary_request(request)
    ]
    assert all(len(questions) == 1 for questions in asked), asked
