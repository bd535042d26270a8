"""Archival storage: passages saved now, embedded in the background.

Embedding a sentence costs milliseconds; an insert should not make the agent's
step wait for it. Passages are stored at once without a vector and embedded by
a background task; a search first waits for that agent's pending embeddings,
so it never misses a passage that was just saved. Passages left without a
vector by a crash are picked up again the next time the agent loads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from memory.embeddings import Embedder
from memory.store import Store
from memory.types import Passage, SearchPage

log = logging.getLogger(__name__)


class ArchivalMemory:
    def __init__(self, store: Store, embedder: Embedder) -> None:
        self.store = store
        self.embedder = embedder
        self._pending: dict[str, set[asyncio.Task[None]]] = {}

    async def insert(self, agent_id: str, passages: Sequence[Passage]) -> list[int]:
        ids = await self.store.insert_passages(agent_id, passages)
        for passage, passage_id in zip(passages, ids, strict=True):
            passage.id = passage_id
        self._embed_later(agent_id, list(passages))
        return ids

    async def resume_pending(self, agent_id: str) -> int:
        """Embed passages a crash left without a vector; returns how many."""
        missing = await self.store.passages_without_embedding(agent_id)
        if missing:
            log.info("agent %s: embedding %d passages left unembedded", agent_id, len(missing))
            self._embed_later(agent_id, missing)
        return len(missing)

    def _embed_later(self, agent_id: str, passages: list[Passage]) -> None:
        task = asyncio.get_running_loop().create_task(self._embed(agent_id, passages))
        tasks = self._pending.setdefault(agent_id, set())
        tasks.add(task)
        task.add_done_callback(lambda done: self._forget_task(agent_id, done))

    def _forget_task(self, agent_id: str, task: asyncio.Task[None]) -> None:
        tasks = self._pending.get(agent_id)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._pending[agent_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("agent %s: background embedding failed: %s", agent_id, task.exception())

    async def _embed(self, agent_id: str, passages: list[Passage]) -> None:
        vectors = await self.embedder.embed([passage.text for passage in passages])
        await self.store.set_embeddings(
            agent_id, {passage.id: vector.tolist() for passage, vector in zip(passages, vectors, strict=True)}
        )

    async def settle(self, agent_id: str) -> None:
        """Wait until every passage saved so far for this agent is searchable."""
        tasks = list(self._pending.get(agent_id, ()))
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def settle_all(self) -> None:
        tasks = [task for tasks in self._pending.values() for task in tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def search(self, agent_id: str, query: str, limit: int, offset: int = 0) -> SearchPage:
        await self.settle(agent_id)
        vector = await self.embedder.embed_one(query)
        return await self.store.search_passages(agent_id, query, vector.tolist(), limit, offset)

    def forget(self, agent_id: str) -> None:
        for task in self._pending.pop(agent_id, set()):
            task.cancel()
