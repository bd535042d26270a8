"""Selective forget end to end: "forget what I told you about my diagnosis".

A person tells the agent about a diagnosis in a DM (the agent notes it in
working context and archival storage, and the DM summary mentions it) and
about hiking. Then they ask, in chat, to forget the diagnosis: the model
calls forget_memories, shows the matches, the person says yes in their next
message and the model confirms. From the confirmation on, no request body the
local LLM server receives holds the words, searches find nothing, the notes,
passages and summary hold nothing of it, and hiking is still known. Real
SQLite and FerretDB, real HTTP to the scripted model, real embeddings.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bot.commands.catalog import run
from bot.commands.model import Caller
from bot.events import UserMessage
from bot.forgetting.erasing import REWRITE_INSTRUCTIONS
from bot.llm import LLMClient
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.places import DM
from memory.store import Store
from memory.types import utc_now
from tests.conftest import RuntimeFactory, make_settings
from tests.fake_llm import FakeLLMServer, Reply, reply_text, reply_tool_calls, tool_call
from tests.mongo_server import MongoTarget, mongo_target
from tests.test_cli import base_env, memgpt, ok

__all__ = ["mongo_target"]

SECRET = re.compile(r"hypothyroid|levothyroxine|diagnos", re.IGNORECASE)
USER = "T1:U1"
REWRITE = REWRITE_INSTRUCTIONS[:40]
SUMMARY = "The person works as a nurse. The person has hypothyroidism and takes levothyroxine. They love hiking."


def said(text: str) -> UserMessage:
    return UserMessage(platform="slack", user_id=USER, text=text, place=DM)


def _send(text: str) -> Reply:
    return reply_tool_calls(tool_call("send_message", {"message": text}))


def scripted(rewrite_keeps_the_topic: bool) -> Any:
    """The model of the story: each event's first step acts on the person's words,
    a step after a function result answers from that result."""

    def model(request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        if REWRITE in (messages[0].get("content") or ""):
            if rewrite_keeps_the_topic:  # a summarizer that ignores the request: the sentences go instead
                return reply_text(messages[-1]["content"])
            return reply_text("The person works as a nurse. They love hiking.")
        last = messages[-1]
        if last["role"] == "tool":
            result = json.loads(last["content"])["result"]
            if result == "Sent.":
                return reply_text("(waiting)")
            code = re.search(r"with code '([0-9a-f]+)'", result)
            if code:
                return _send(f"I found this: {result.split('Nothing is deleted')[0]} Shall I forget it?")
            return _send(f"Done. {result}")
        text = last["content"] if isinstance(last["content"], str) else json.dumps(last["content"])
        if "diagnosed" in text:
            return reply_tool_calls(
                tool_call(
                    "core_memory_append",
                    {"name": "human", "content": "Diagnosed with hypothyroidism.", "request_heartbeat": False},
                ),
                tool_call(
                    "archival_memory_insert",
                    {"content": "Person has hypothyroidism and takes levothyroxine daily.", "request_heartbeat": False},
                ),
                tool_call("send_message", {"message": "Thank you for telling me about the hypothyroidism."}),
            )
        if "hiking" in text:
            return reply_tool_calls(
                tool_call(
                    "core_memory_append",
                    {"name": "human", "content": "Loves hiking in the Alps.", "request_heartbeat": False},
                ),
                tool_call(
                    "archival_memory_insert",
                    {"content": "Went hiking in the Alps in June.", "request_heartbeat": False},
                ),
                tool_call("send_message", {"message": "The Alps sound wonderful."}),
            )
        if "forget what I told you" in text:
            topic = {"topic": "my diagnosis, hypothyroidism", "request_heartbeat": True}
            return reply_tool_calls(tool_call("forget_memories", topic))
        if "yes, forget it" in text:
            code = None
            for message in reversed(messages):
                if message["role"] == "tool":
                    found = re.search(r"with code '([0-9a-f]+)'", message["content"])
                    if found:
                        code = found.group(1)
                        break
            assert code is not None, "the code must be in the queue until the confirmation"
            return reply_tool_calls(tool_call("forget_memories", {"code": code, "request_heartbeat": True}))
        return _send("I remember you love hiking.")

    return model


def forget_confirm_answered(body: dict[str, Any]) -> bool:
    """The request holds the confirm call's result (the first one made after the deletion)."""
    calls = {
        call["id"]
        for message in body["messages"]
        for call in message.get("tool_calls") or []
        if call["function"]["name"] == "forget_memories" and "code" in json.loads(call["function"]["arguments"])
    }
    return any(message.get("tool_call_id") in calls for message in body["messages"])


async def tell_and_forget(runtime: Runtime, llm_server: FakeLLMServer, store: Store) -> tuple[str, int]:
    """The story up to the confirmation; the agent id and the first request made after it."""
    await runtime.handle(said("I was diagnosed with hypothyroidism last spring."))
    await runtime.handle(said("I went hiking in the Alps, I love hiking."))
    agent = await runtime.agent(f"slack:{USER}")
    # The DM's summary, as a flush would have written it.
    await store.update_queue(agent.id, SUMMARY, agent.conversation.record.queue_start_seq, utc_now(), place=DM.key)
    runtime.doors.drop_agent(f"slack:{USER}")
    await runtime.handle(said("Please forget what I told you about my diagnosis."))
    asked = llm_server.requests[-1]
    assert SECRET.search(json.dumps(asked)), "the question shows what was found"
    before = len(llm_server.requests)
    # A confirmation in the same chain as the question is refused: the person must answer.
    replies = await runtime.handle(said("yes, forget it"))
    assert "Done. Forgotten: " in replies[-1].text
    bodies = llm_server.requests[before:]
    confirmed = next(n for n, body in enumerate(bodies) if forget_confirm_answered(body))
    return agent.id, before + confirmed


async def check_forgotten(runtime: Runtime, llm_server: FakeLLMServer, agent_id: str, after: int) -> None:
    replies = await runtime.handle(said("What do you know about me?"))
    assert replies[-1].text == "I remember you love hiking."
    later = llm_server.requests[after:]
    assert len(later) >= 2
    # The bytes the server received, as sent: the parsed bodies are only what found them.
    raw = [rec.raw_body.decode() for rec in llm_server.raw_requests if any(rec.body is body for body in later)]
    assert len(raw) == len(later)
    leaking = [n for n, body in enumerate(raw) if SECRET.search(body)]
    assert leaking == [], f"{len(leaking)} of {len(later)} requests after the forget still carry the words"
    assert "hiking" in json.dumps(later[-1])  # what was not forgotten is still there

    store = runtime.store
    for query in ("hypothyroidism", "my diagnosis", "levothyroxine"):
        page = await runtime.recall.search(agent_id, query, 50)
        assert not [m for m in page.items if SECRET.search(m.searchable_text())]
        keyword = await store.search_messages(agent_id, query, 50)
        assert not [m for m in keyword.items if SECRET.search(m.searchable_text())]
        passages = await runtime.archival.search(agent_id, query, 50)
        assert not [p for p, _ in passages.items if SECRET.search(p.text)]
    assert not [m for m in await store.messages_since(agent_id, 0) if SECRET.search(m.searchable_text())]
    assert not SECRET.search(" ".join(b.value for b in await store.load_blocks(agent_id)))
    assert {p.text for p in await store.list_passages(agent_id, 10)} == {"Went hiking in the Alps in June."}
    dm = await store.get_conversation(agent_id, DM.key)
    assert not SECRET.search(dm.summary) and "hiking" in dm.summary and "nurse" in dm.summary
    assert await store.count_messages(agent_id) == len(await store.messages_since(agent_id, 0))


async def test_a_topic_is_forgotten_everywhere_on_sqlite(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(scripted(rewrite_keeps_the_topic=False))
    runtime = await make_runtime()
    agent_id, after = await tell_and_forget(runtime, llm_server, runtime.store)
    await check_forgotten(runtime, llm_server, agent_id, after)


async def test_a_confirmation_in_the_asking_chain_is_refused(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    """The model cannot confirm on its own: a confirm in the same event as the question fails."""

    def eager(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            found = re.search(r"with code '([0-9a-f]+)'", last["content"])
            if found:
                return reply_tool_calls(
                    tool_call("forget_memories", {"code": found.group(1), "request_heartbeat": True})
                )
            result = json.loads(last["content"])["result"]
            return reply_text("(waiting)") if result == "Sent." else _send(f"Result: {result}")
        if "I love hiking" in json.dumps(last):
            return reply_tool_calls(
                tool_call("archival_memory_insert", {"content": "Loves hiking.", "request_heartbeat": False}),
                tool_call("send_message", {"message": "ok"}),
            )
        return reply_tool_calls(tool_call("forget_memories", {"topic": "hiking", "request_heartbeat": True}))

    llm_server.set_handler(eager)
    runtime = await make_runtime()
    await runtime.handle(said("I love hiking."))
    replies = await runtime.handle(said("forget hiking"))
    assert "has not answered yet" in replies[-1].text
    agent = await runtime.agent(f"slack:{USER}")
    assert await runtime.store.count_passages(agent.id) == 1


async def test_a_topic_is_forgotten_everywhere_on_mongodb(
    tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, mongo_target: MongoTarget
) -> None:
    """The same story on MongoDB, with a summarizer that ignores the request: the sentences go."""
    llm_server.set_handler(scripted(rewrite_keeps_the_topic=True))
    settings = make_settings(tmp_path / "data")
    llm = LLMClient(settings.model, api_key=settings.openai_api_key, base_url=llm_server.base_url, timeout=5.0)
    store = mongo_target.store()
    runtime = await Runtime.create(settings, store=store, llm=llm, embedder=embedder)
    try:
        agent_id, after = await tell_and_forget(runtime, llm_server, store)
        await check_forgotten(runtime, llm_server, agent_id, after)
    finally:
        await runtime.close(close_embedder=False)


@pytest.mark.parametrize("item_kind", ["note", "passage", "summary"])
async def test_one_ledger_item_is_forgotten_by_its_id(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, item_kind: str
) -> None:
    llm_server.set_handler(scripted(rewrite_keeps_the_topic=False))
    runtime = await make_runtime()
    await runtime.handle(said("I was diagnosed with hypothyroidism last spring."))
    agent = await runtime.agent(f"slack:{USER}")
    await runtime.store.update_queue(agent.id, SUMMARY, 1, utc_now(), place=DM.key)
    page = await runtime.ledger(f"slack:{USER}")
    assert page is not None
    text = page.text()
    assert "Note: Diagnosed with hypothyroidism." in text and "learned in your DMs" in text
    assert "Messages: " in text
    item = next(i for i in page.items if i.kind == item_kind and SECRET.search(i.text))
    # As `/memory forget <id>` asks it, on any platform.
    alice = Caller("slack", USER)
    answer = await run(runtime, "memory", alice, {"forget": item.id})
    assert answer.text.startswith("Forgotten: ")
    after = await runtime.ledger(f"slack:{USER}")
    assert after is not None and item.id not in {i.id for i in after.items}
    again = await run(runtime, "memory", alice, {"forget": item.id})
    assert again.text.startswith("No item")


def test_the_cli_imports_embedded_shows_items_and_forgets_a_topic(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    """`memory import` embeds before it returns; `memory show` lists items with where and when;
    `memory forget --about` shows the matches, deletes them and prints the receipt."""
    env = base_env(llm_server.base_url, tmp_path / "data")
    history = tmp_path / "history.jsonl"
    lines = [
        ("user", "I am allergic to penicillin, it gives me hives."),
        ("assistant", "Noted, no penicillin for you."),
        ("user", "My sister lives in Lisbon."),
        ("assistant", "Lisbon is lovely."),
    ]
    history.write_text(
        "".join(
            json.dumps({"role": role, "content": text, "timestamp": f"2024-05-0{n + 1}T10:00:00"}) + "\n"
            for n, (role, text) in enumerate(lines)
        ),
        encoding="utf-8",
    )
    ok(memgpt("memory", "import", "--user", "alice", str(history), env=env, cwd=tmp_path))
    with sqlite3.connect(tmp_path / "data" / "memgpt.sqlite3") as conn:
        assert conn.execute("SELECT count(*) FROM messages WHERE embedding IS NULL").fetchone() == (0,)

    shown = ok(memgpt("memory", "show", "--user", "alice", env=env, cwd=tmp_path))
    assert "Items held (forget one: memory forget --item ID):" in shown
    assert "Messages: 4 messages (learned in your DMs)" in shown

    refused = memgpt("memory", "forget", "--user", "alice", "--about", "penicillin", env=env, cwd=tmp_path)
    assert refused.returncode != 0 and "--yes" in refused.stderr  # no terminal to confirm at

    out = ok(memgpt("memory", "forget", "--user", "alice", "--about", "penicillin", "--yes", env=env, cwd=tmp_path))
    assert "About 'penicillin' I hold 2 messages:" in out
    assert out.rstrip().endswith(
        "Forgotten: 2 messages, 0 saved passages, 0 notes from working context; 0 summaries rewritten."
    )
    found = json.loads(
        ok(memgpt("memory", "search", "--user", "alice", "--recall", "penicillin", "--json", env=env, cwd=tmp_path))
    )
    assert [item["content"] for item in found["results"]] == ["My sister lives in Lisbon.", "Lisbon is lovely."]
    exported = ok(memgpt("memory", "export", "--user", "alice", env=env, cwd=tmp_path))
    assert "penicillin" not in exported and "Lisbon" in exported
