"""Recall search by meaning and keywords, with messages embedded lazily.

Embedding every message as it arrives would cost CPU on every chat event, and
most agents never search their recall. So a message is embedded the first
time its agent searches recall, and at most once: a search first embeds the
agent's newest not-yet-embedded messages (up to BATCH, one embedder call) and
stores their vectors, then ranks by cosine + keyword bonus
(MessageStore.search_messages with a query vector). A longer backlog (an old history
searched for the first time) is left to a background task, BATCH at a time,
so this search answers quickly (older messages are still found by keywords)
and the next one is complete.

A per-agent lock makes the foreground batch and the background ones take
turns, so no message is embedded twice. Nothing here is persistent: a
backlog left by a restart is picked up by the agent's next search.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import numpy as np

from memory.embeddings import Embedder
from memory.places import Visibility
from memory.roles import MessageEmbeddingStore, MessageStore
from memory.types import SearchPage

log = logging.getLogger(__name__)

# Messages embedded per embedder call: enough for a typical history in one
# search, small enough that the search waits well under a second or two.
BATCH = 256
# Seconds without a new line after which a gathering background embedding takes what it has.
QUIET = 0.1


class RecallMemory:
    def __init__(self, store: MessageStore, embedder: Embedder) -> None:
        self.store = store
        # Capability as a type: a store that cannot hold message embeddings is
        # searched by keywords alone.
        self._vectors = store if isinstance(store, MessageEmbeddingStore) else None
        self.embedder = embedder
        self._locks: dict[str, asyncio.Lock] = {}
        self._backlog: dict[str, asyncio.Task[None]] = {}
        # Agents given more to embed while their background run was under way.
        self._again: set[str] = set()

    async def search(
        self, agent_id: str, query: str, limit: int, offset: int = 0, *, visible: Visibility | None = None
    ) -> SearchPage:
        """The agent's messages ranked by meaning and keywords (BM25 only if
        the store cannot hold message embeddings or embedding fails); with
        `visible`, only those the place it describes may read. Embedding
        covers every message (it is not a read)."""
        if self._vectors is None:
            return await self.store.search_messages(agent_id, query, limit, offset, visible=visible)
        try:
            # The query goes in the batch's embedder call: one model run, not two.
            more, query_vector = await self._embed_batch(agent_id, query=query)
            vector = (query_vector if query_vector is not None else await self.embedder.embed_one(query)).tolist()
        except Exception as error:  # a store or model failure: keyword search still answers
            log.warning("agent %s: recall embedding failed, searching by keywords only: %s", agent_id, error)
            return await self.store.search_messages(agent_id, query, limit, offset, visible=visible)
        if more:
            self.embed_later(agent_id)
        return await self.store.search_messages(agent_id, query, limit, offset, query_vector=vector, visible=visible)

    async def embed_all(self, agent_id: str, progress: Callable[[int], None] | None = None) -> int:
        """Embed every message of the agent still without a vector, BATCH at a
        time, before returning (an import: the next search is complete at once);
        `progress` is told how many each batch embedded. Returns the total."""
        done: set[int] = set()
        while True:
            before = len(done)
            more, _ = await self._embed_batch(agent_id, done)
            if progress is not None and len(done) > before:
                progress(len(done) - before)
            if not more:
                return len(done)

    async def _embed_batch(
        self, agent_id: str, done: set[int] | None = None, query: str | None = None
    ) -> tuple[bool, np.ndarray | None]:
        """Embed the agent's newest BATCH unembedded messages (and `query`, in the
        same embedder call, when there are some): whether more may remain, and the
        query's vector (None: not embedded here). `done` (seqs already embedded by
        this caller) are not embedded again: no loop on messages whose vectors the
        store did not keep (nor on one edited since, left to the next run)."""
        store = self._vectors
        if store is None:
            return False, None
        async with self._locks.setdefault(agent_id, asyncio.Lock()):
            pending = await store.messages_without_embedding(agent_id, BATCH)
            full = len(pending) == BATCH
            if done is not None:
                pending = [message for message in pending if message.seq not in done]
                done.update(message.seq for message in pending)
            if not pending:
                return False, None
            asked = [query] if query is not None else []
            vectors = await self.embedder.embed([message.said_text() for message in pending] + asked)
            found = vectors[: len(pending)]
            await store.set_message_embeddings(
                agent_id, {message.seq: vector.tolist() for message, vector in zip(pending, found, strict=True)}
            )
            return full, (vectors[len(pending)] if asked else None)

    def embed_later(self, agent_id: str, gather: float = 0.0) -> None:
        """Embed the agent's messages still without a vector in the background,
        BATCH at a time (never on the caller's path): a search's backlog, or
        what a channel memory just kept (memory/channels.py). Called while a
        run is under way, that run goes on to what arrived meanwhile. `gather`:
        seconds to wait before a batch that would not be full, so that lines
        arriving one by one are embedded (and stored) many at a time."""
        running = self._backlog.get(agent_id)
        if running is not None and not running.done():
            self._again.add(agent_id)
            return
        task = asyncio.get_running_loop().create_task(self._embed_backlog(agent_id, gather))
        self._backlog[agent_id] = task
        task.add_done_callback(lambda finished: self._finished(agent_id, finished))

    async def _embed_backlog(self, agent_id: str, gather: float = 0.0) -> None:
        done: set[int] = set()
        more = False
        while True:
            if gather and not more:
                await self._gather(agent_id, gather)
            more = (await self._embed_batch(agent_id, done))[0]
            if not more and agent_id not in self._again:
                return
            self._again.discard(agent_id)

    async def _gather(self, agent_id: str, gather: float) -> None:
        """Wait while lines keep coming, at most `gather` seconds: until none came for QUIET
        seconds (a stream that stopped is embedded at once, not after the whole wait)."""
        deadline = asyncio.get_running_loop().time() + gather
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            self._again.discard(agent_id)
            await asyncio.sleep(min(QUIET, left))
            if agent_id not in self._again:
                return

    def _finished(self, agent_id: str, task: asyncio.Task[None]) -> None:
        if self._backlog.get(agent_id) is task:
            del self._backlog[agent_id]
            self._again.discard(agent_id)
            # No one waits on the lock once the backlog is done (searches hold
            # it only while they run): dropping it keeps the dict bounded.
            lock = self._locks.get(agent_id)
            if lock is not None and not lock.locked():
                del self._locks[agent_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("agent %s: background recall embedding failed: %s", agent_id, task.exception())

    async def settle(self, agent_id: str) -> None:
        """Wait until the agent's background embedding is done (tests)."""
        task = self._backlog.get(agent_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def forget(self, agent_id: str) -> None:
        """The agent is being deleted: stop embedding its messages."""
        self._again.discard(agent_id)
        task = self._backlog.pop(agent_id, None)
        if task is not None:
            task.cancel()
        self._locks.pop(agent_id, None)

    async def close(self) -> None:
        """Stop background embedding (a backlog resumes on the next search)."""
        tasks = list(self._backlog.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
