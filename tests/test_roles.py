"""Capability is a type: a store without a role is served by what it has,
and no code path counts on catching NotImplementedError."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from memory.archival import ArchivalMemory
from memory.places import Visibility
from memory.recall import RecallMemory
from memory.roles import MessageEmbeddingStore, MessageStore, PassageStore, SourceStore
from memory.sqlite.store import SQLiteStore
from memory.types import Block, Message, Passage, SearchPage

ROOT = Path(__file__).resolve().parent.parent


class NoEmbedder:
    """The embedder a keyword-only search must never call."""

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise AssertionError("a store without message embeddings was asked to embed")

    async def embed_one(self, text: str) -> np.ndarray:
        raise AssertionError("a store without message embeddings was asked to embed")


class MessagesOnly:
    """A real SQLite store seen through the MessageStore role alone (what a
    backend without recall embeddings would offer)."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    async def append_messages(self, agent_id: str, messages: Sequence[Message]) -> list[Message]:
        return await self._store.append_messages(agent_id, messages)

    async def messages_since(self, agent_id: str, seq: int, *, place: str | None = None) -> list[Message]:
        return await self._store.messages_since(agent_id, seq, place=place)

    async def count_messages(self, agent_id: str, *, visible: Visibility | None = None) -> int:
        return await self._store.count_messages(agent_id, visible=visible)

    async def delete_messages(self, agent_id: str, seqs: Sequence[int]) -> int:
        return await self._store.delete_messages(agent_id, seqs)

    async def search_messages(
        self,
        agent_id: str,
        query: str,
        limit: int,
        offset: int = 0,
        *,
        query_vector: Sequence[float] | None = None,
        visible: Visibility | None = None,
    ) -> SearchPage:
        assert query_vector is None, "no vectors without the embedding role"
        return await self._store.search_messages(agent_id, query, limit, offset, visible=visible)

    async def messages_between(
        self,
        agent_id: str,
        start: datetime,
        end: datetime,
        limit: int,
        offset: int = 0,
        *,
        visible: Visibility | None = None,
    ) -> SearchPage:
        return await self._store.messages_between(agent_id, start, end, limit, offset, visible=visible)

    async def event_message_seq(self, agent_id: str, event_id: str) -> int | None:
        return await self._store.event_message_seq(agent_id, event_id)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    sqlite_store = SQLiteStore(tmp_path / "memory.db")
    await sqlite_store.open()
    yield sqlite_store
    await sqlite_store.close()


async def test_recall_without_the_embedding_role_searches_by_keywords(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    agent, _ = await store.get_or_create_agent("terminal:maya", [Block("human", "", 100)])
    await store.append_messages(agent.id, [Message("user", "my locker code is 4417"), Message("user", "hello")])
    narrow = MessagesOnly(store)
    assert isinstance(narrow, MessageStore) and not isinstance(narrow, MessageEmbeddingStore)

    page = await RecallMemory(narrow, NoEmbedder()).search(agent.id, "locker code", 5)  # type: ignore[arg-type]
    assert [m.content for m in page.items] == ["my locker code is 4417"]
    assert await store.messages_without_embedding(agent.id, 10) != []  # nothing was embedded
    assert caplog.records == []  # the plain path, not an embedding failure recovered from


class PassagesOnly:
    """Archival storage without shared collections."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        if name in {"attached_sources", "create_source", "find_source"} or name.endswith("_source"):
            raise AttributeError(name)
        return getattr(self._store, name)


async def test_archival_without_the_source_role_searches_the_agent_alone(store: SQLiteStore, embedder: object) -> None:
    agent, _ = await store.get_or_create_agent("terminal:maya", [])
    narrow = PassagesOnly(store)
    assert isinstance(narrow, PassageStore) and not isinstance(narrow, SourceStore)
    archival = ArchivalMemory(narrow, embedder)  # type: ignore[arg-type]
    await archival.insert(agent.id, [Passage("The spare key is under the blue flowerpot.")])
    page = await archival.search(agent.id, "where is the spare key", 3)
    assert [(p.text, p.collection) for p, _ in page.items] == [("The spare key is under the blue flowerpot.", None)]


def test_no_storage_code_raises_or_catches_not_implemented() -> None:
    # The old Store raised NotImplementedError for a missing feature and its
    # callers caught it; the roles replaced both.
    storage = [
        *(ROOT / "memory").glob("*.py"),
        *(ROOT / "memory" / "sqlite").glob("*.py"),
        *(ROOT / "memory" / "mongo").glob("*.py"),
        *(ROOT / "bot" / "durable").glob("*.py"),
        ROOT / "bot" / "limits.py",
    ]
    exempt = {"memory/tokens.py", "memory/mongo/capabilities.py"}  # a tokenizer's API; a server's missing command
    offenders = []
    for path in sorted(storage):
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and node.id == "NotImplementedError" and name not in exempt:
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []
