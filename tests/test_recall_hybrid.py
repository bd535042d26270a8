"""conversation_search by meaning and keywords: real embeddings, real SQLite.

Recall messages are embedded lazily, on the agent's first searches
(memory/recall.py); these tests hold the ranking, the laziness (each message
embedded once, a long backlog finished in the background) and forgetting.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from memory.embeddings import Embedder
from memory.recall import BATCH, RecallMemory
from memory.sqlite.migrations import MIGRATIONS, migrate
from memory.sqlite.recall import PENDING_WHERE
from memory.sqlite.store import SQLiteStore
from memory.types import Message
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call
from tests.helpers import said
from tests.test_agent_functions import last_tool_result
from tests.test_sqlite_store import tables_containing

CHATTER = [
    "The train was late again this morning.",
    "I finished reading that detective novel.",
    "Can you remind me to water the tomatoes?",
    "My laptop battery barely lasts two hours now.",
    "We had pasta with pesto for dinner.",
    "The football match got moved to Friday.",
    "I think the dentist appointment is on Tuesday.",
    "The coffee at the new place is too bitter.",
]
WEDDING = "My sister is getting married in June"


class CountingEmbedder:
    """The real embedder, counting every text it is asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.calls: list[list[str]] = []

    @property
    def texts(self) -> list[str]:
        """The messages embedded (a search's query rides along in its batch's call)."""
        return [text for call in self.calls for text in call if text.startswith("alice: ")]

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return await self.inner.embed(texts)

    async def embed_one(self, text: str) -> np.ndarray:
        return await self.inner.embed_one(text)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    backend = SQLiteStore(tmp_path / "recall.db")
    await backend.open()
    yield backend
    await backend.close()


async def chat(store: SQLiteStore, texts: Sequence[str]) -> str:
    agent, _ = await store.get_or_create_agent("terminal:alice", [])
    await store.append_messages(agent.id, [Message("user", f"alice: {text}") for text in texts])
    return agent.id


async def test_paraphrase_is_found_end_to_end(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.script(
        *(reply_tool_calls(tool_call("send_message", {"message": "I see."})) for _ in range(len(CHATTER) + 1)),
        reply_tool_calls(
            tool_call("conversation_search", {"query": "family wedding plans", "request_heartbeat": True})
        ),
        reply_tool_calls(tool_call("send_message", {"message": "Your sister's wedding in June!"})),
    )
    runtime = await make_runtime()
    for text in [*CHATTER[:4], WEDDING, *CHATTER[4:]]:
        await runtime.handle(said(text))
    replies = await runtime.handle(said("What was that big event coming up?"))
    assert [reply.text for reply in replies] == ["Your sister's wedding in June!"]
    result = last_tool_result(llm_server.requests[-1])
    assert result["status"] == "OK"
    assert WEDDING in result["result"]
    # The search embedded the history once; nothing is left to embed.
    agent = await runtime.agent("terminal:alice")
    assert await runtime.store.messages_without_embedding(agent.id, 10) == []


async def test_keywords_alone_miss_the_paraphrase(store: SQLiteStore, embedder: Embedder) -> None:
    agent_id = await chat(store, [*CHATTER[:4], WEDDING, *CHATTER[4:]])
    bm25_only = await store.search_messages(agent_id, "family wedding plans", 5)
    assert bm25_only.items == []
    hybrid = await RecallMemory(store, embedder).search(agent_id, "family wedding plans", 5)
    assert WEDDING in (hybrid.items[0].content or "")


async def test_exact_code_is_first_among_look_alikes(store: SQLiteStore, embedder: Embedder) -> None:
    codes = ["QX-4471-ZQ", "QX-4417-ZP", "QX-4471-ZB", "QX-4471-ZP", "QZ-4471-ZP", "QX-4771-ZP"]
    agent_id = await chat(store, [*CHATTER, *(f"Where is my order {code}? It has not arrived." for code in codes)])
    page = await RecallMemory(store, embedder).search(agent_id, "order QX-4471-ZP", 5)
    assert "QX-4471-ZP?" in (page.items[0].content or "")
    assert page.total >= len(codes)


async def test_each_message_is_embedded_once_and_a_backlog_finishes_in_the_background(
    store: SQLiteStore, embedder: Embedder
) -> None:
    history = [f"note {n}: the weather on day {n} was mild" for n in range(BATCH + 40)]
    agent_id = await chat(store, [WEDDING, *history])
    counting = CountingEmbedder(embedder)
    recall = RecallMemory(store, counting)  # type: ignore[arg-type]

    await recall.search(agent_id, "family wedding plans", 5)
    # The newest BATCH at once, with the query in the same embedder call; the
    # rest (the wedding among them) in the background.
    assert counting.calls[0] == [*(f"alice: {text}" for text in reversed(history[-BATCH:])), "family wedding plans"]
    await recall.settle(agent_id)
    assert await store.messages_without_embedding(agent_id, 10) == []
    assert sorted(counting.texts) == sorted(f"alice: {text}" for text in [WEDDING, *history])

    page = await recall.search(agent_id, "family wedding plans", 5)
    assert WEDDING in (page.items[0].content or "")
    # Nothing embedded twice, nothing embedded by the second search.
    assert len(counting.texts) == len(history) + 1

    # New messages are embedded by the next search only.
    await store.append_messages(agent_id, [Message("user", "alice: we adopted a puppy")])
    assert len(counting.texts) == len(history) + 1
    page = await recall.search(agent_id, "new dog in the family", 5)
    assert counting.texts[-1] == "alice: we adopted a puppy"
    assert page.items[0].content == "alice: we adopted a puppy"


async def test_forget_leaves_no_embedding_behind(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    secret = "xylophone-7731"
    llm_server.script(
        reply_tool_calls(tool_call("send_message", {"message": "Noted."})),
        reply_tool_calls(tool_call("conversation_search", {"query": "instrument", "request_heartbeat": True})),
        reply_tool_calls(tool_call("send_message", {"message": "Found it."})),
    )
    runtime = await make_runtime()
    await runtime.handle(said(f"My locker code is {secret}"))
    await runtime.handle(said("What was my locker code?"))
    agent = await runtime.agent("terminal:alice")
    store = runtime.store
    assert isinstance(store, SQLiteStore)
    assert agent.id in store._recall.cached_agents
    db_path = store.path
    assert "messages" in tables_containing(db_path, secret)

    assert await runtime.forget("terminal:alice")
    assert agent.id not in store._recall.cached_agents
    assert tables_containing(db_path, secret) == set()
    assert tables_containing(db_path, agent.id[8:]) == set()


async def test_migration_adds_the_column_to_an_existing_history(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, MIGRATIONS[:-1])
    conn.execute("INSERT INTO agents (id, key, created_at) VALUES ('a1', 'terminal:old', 0)")
    conn.execute(
        "INSERT INTO messages (agent_id, seq, role, content, created_at) VALUES ('a1', 1, 'user', 'old words', 0)"
    )
    conn.close()

    store = SQLiteStore(path)
    await store.open()
    try:
        assert [m.content for m in await store.messages_without_embedding("a1", 10)] == ["old words"]
        plan = await store.run_in_db(
            lambda db: db.execute(
                f"EXPLAIN QUERY PLAN SELECT seq FROM messages WHERE agent_id = ? AND {PENDING_WHERE}"
                " ORDER BY seq DESC LIMIT 5",
                ("a1",),
            ).fetchall()
        )
        assert "messages_unembedded" in " ".join(str(row) for row in plan)
    finally:
        await store.close()


async def test_keyword_statistics_follow_new_messages(store: SQLiteStore) -> None:
    # Each agent's index is read once and then kept up to date: messages
    # appended after a search (each holding the query word) are candidates of
    # the next one, and their word's statistics follow.
    agent_id = await chat(store, ["zucchini at all"])
    vector = [1.0, 0.0, 0.0]
    await store.set_message_embeddings(agent_id, {1: vector})
    assert (await store.search_messages(agent_id, "zucchini", 5, query_vector=vector)).total == 1
    await store.append_messages(agent_id, [Message("user", f"zucchini {n}") for n in range(20)])
    page = await store.search_messages(agent_id, "zucchini", 50, query_vector=vector)
    assert page.total == 21 and page.items[0].seq == 1
