"""The one storage interface. Every backend (SQLite, MongoDB) implements it and
passes the same conformance suite (tests/conformance).

Every method that touches memory takes the agent id first: the store has no
call that reads or searches across agents, except the admin ones whose names
say so (`list_agents`, `delete_agent`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime

from memory.types import AgentRecord, Block, Message, Passage, SearchPage


class StoreError(Exception):
    """A storage failure the caller can report to a person (disk full, locked...)."""


class Store(ABC):
    # -- life cycle -------------------------------------------------------
    @abstractmethod
    async def open(self) -> None:
        """Connect, create or migrate the schema and indexes (idempotent)."""

    @abstractmethod
    async def close(self) -> None: ...

    # -- agents (admin calls are the only ones that span agents) ----------
    @abstractmethod
    async def get_or_create_agent(
        self, key: str, default_blocks: Sequence[Block]
    ) -> tuple[AgentRecord, list[Block]]:
        """The agent for `key` ("platform:user"), created with `default_blocks`
        on first use. Safe under concurrent calls for the same key."""

    @abstractmethod
    async def find_agent(self, key: str) -> AgentRecord | None: ...

    @abstractmethod
    async def list_agents(self) -> list[AgentRecord]:
        """Admin: every agent, oldest first."""

    @abstractmethod
    async def delete_agent(self, agent_id: str) -> None:
        """Admin / forget: remove the agent and everything stored for it."""

    # -- working context --------------------------------------------------
    @abstractmethod
    async def load_blocks(self, agent_id: str) -> list[Block]: ...

    @abstractmethod
    async def save_block(self, agent_id: str, block: Block) -> None:
        """Replace one block whole (a single atomic write)."""

    # -- FIFO queue state -------------------------------------------------
    @abstractmethod
    async def update_queue(
        self, agent_id: str, summary: str, queue_start_seq: int, summary_updated_at: datetime
    ) -> None:
        """Record an eviction: the new recursive summary and where the queue now
        starts, in one atomic write."""

    # -- recall storage ---------------------------------------------------
    @abstractmethod
    async def append_messages(self, agent_id: str, messages: Sequence[Message]) -> list[Message]:
        """Store messages in order, in one transaction, assigning each the next
        `seq`. Returns them with `seq` set."""

    @abstractmethod
    async def messages_since(self, agent_id: str, seq: int) -> list[Message]:
        """Messages with `seq >= seq`, oldest first."""

    @abstractmethod
    async def count_messages(self, agent_id: str) -> int: ...

    @abstractmethod
    async def search_messages(
        self, agent_id: str, query: str, limit: int, offset: int = 0
    ) -> SearchPage:
        """Ranked by relevance to `query` (not bare substring match)."""

    @abstractmethod
    async def messages_between(
        self, agent_id: str, start: datetime, end: datetime, limit: int, offset: int = 0
    ) -> SearchPage:
        """Messages with start <= created_at < end, oldest first."""

    # -- archival storage -------------------------------------------------
    @abstractmethod
    async def insert_passages(self, agent_id: str, passages: Sequence[Passage]) -> list[int]:
        """Store passages (embedding may still be None); returns their ids."""

    @abstractmethod
    async def set_embeddings(
        self, agent_id: str, vectors: dict[int, list[float]]
    ) -> None:
        """Attach computed embeddings to passages by id."""

    @abstractmethod
    async def passages_without_embedding(self, agent_id: str) -> list[Passage]: ...

    @abstractmethod
    async def search_passages(
        self,
        agent_id: str,
        query_text: str,
        query_vector: Sequence[float],
        limit: int,
        offset: int = 0,
    ) -> SearchPage:
        """Passages most similar to `query_vector` (cosine), best first."""

    @abstractmethod
    async def list_passages(self, agent_id: str, limit: int, offset: int = 0) -> list[Passage]: ...

    @abstractmethod
    async def count_passages(self, agent_id: str) -> int: ...

    @abstractmethod
    async def delete_passages(self, agent_id: str, ids: Sequence[int]) -> None: ...
