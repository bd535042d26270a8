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
from dataclasses import dataclass, fields

from memory.embeddings import Embedder
from memory.places import Visibility
from memory.roles import PassageStore, SourceStore
from memory.types import Passage, SearchPage

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FoundPassage(Passage):
    """A search result: a passage and the shared collection it belongs to
    (None for the agent's own archival storage)."""

    collection: str | None = None

    @classmethod
    def of(cls, passage: Passage, collection: str | None) -> FoundPassage:
        values = {f.name: getattr(passage, f.name) for f in fields(Passage)}
        return cls(**values, collection=collection)


class ArchivalMemory:
    def __init__(self, store: PassageStore, embedder: Embedder) -> None:
        self.store = store
        # Without shared collections an agent searches its own passages only.
        self._sources = store if isinstance(store, SourceStore) else None
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

    async def search(
        self, agent_id: str, query: str, limit: int, offset: int = 0, *, visible: Visibility | None = None
    ) -> SearchPage:
        """The agent's own passages and those of the collections attached to
        it, merged by score. Items are (FoundPassage, score): each says which
        collection it came from (None: the agent's own archival storage).
        With `visible`, only the agent's own passages that place may read;
        attached collections are shared, so searched unfiltered."""
        await self.settle(agent_id)
        sources = [] if self._sources is None else await self._sources.attached_sources(agent_id)
        vector = (await self.embedder.embed_one(query)).tolist()
        if not sources:
            page = await self.store.search_passages(agent_id, query, vector, limit, offset, visible=visible)
            return SearchPage([(FoundPassage.of(p, None), score) for p, score in page.items], page.total)
        # Page k of the merge lies within the first offset + limit hits of each
        # part; the parts' scores are comparable because each is the same
        # measure of the same query against one store.
        wanted = offset + limit
        parts = await asyncio.gather(
            self.store.search_passages(agent_id, query, vector, wanted, 0, visible=visible),
            *(self.store.search_passages(source.id, query, vector, wanted, 0) for source in sources),
        )
        names: list[str | None] = [None, *(source.name for source in sources)]
        merged = [
            (FoundPassage.of(passage, name), score)
            for name, part in zip(names, parts, strict=True)
            for passage, score in part.items
        ]
        merged.sort(key=lambda item: -item[1])
        return SearchPage(merged[offset:wanted] if limit > 0 else [], sum(part.total for part in parts))

    def forget(self, agent_id: str) -> None:
        for task in self._pending.pop(agent_id, set()):
            task.cancel()
