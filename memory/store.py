"""The one storage interface. Every backend (SQLite, MongoDB) implements it and
passes the same conformance suite (tests/conformance).

Every method that touches memory takes the agent id first: the store has no
call that reads or searches across agents, except the admin ones whose names
say so (`list_agents`, `delete_agent`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
        self, agent_id: str, query: str, limit: int, offset: int = 0, *, query_vector: Sequence[float] | None = None
    ) -> SearchPage:
        """Ranked by relevance to `query` (not bare substring match): BM25.

        With `query_vector` (the embedding of `query`) the ranking is hybrid,
        the archival formula: cosine(query_vector, message embedding) +
        memory.hybrid.KEYWORD_WEIGHT x BM25 coverage, over the candidates =
        the best keyword hits (embedded or not: a message without an embedding
        counts cosine 0) and the nearest embedded messages. `total` is the
        number of candidates. Ties go to the lower seq."""

    # Recall embeddings are computed lazily, only for agents that search their
    # recall (memory/recall.py): embedding every message on arrival would cost
    # CPU on every chat event. Not abstract, like shared collections; the
    # conformance suite (test_recall_hybrid_conformance) holds every backend
    # to these.
    async def messages_without_embedding(self, agent_id: str, limit: int) -> list[Message]:
        """Up to `limit` of the agent's messages still without an embedding,
        newest first; only role user or assistant with non-empty content
        (tool results and system alerts are left to keyword search)."""
        raise NotImplementedError(f"{type(self).__name__} does not embed recall storage")

    async def set_message_embeddings(self, agent_id: str, vectors: Mapping[int, Sequence[float]]) -> None:
        """Attach embeddings to the agent's messages by seq (seqs of other
        agents or unknown ones are ignored); ValueError if their length
        differs from the agent's stored message embeddings."""
        raise NotImplementedError(f"{type(self).__name__} does not embed recall storage")

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
        """Embedded passages ranked by a hybrid of meaning and keywords, best
        first (ties by id, so pages never overlap): relevance is the cosine of
        `query_vector` plus a keyword bonus of up to memory.hybrid.KEYWORD_WEIGHT
        for how much of `query_text` (rare words, ids, codes, names) the
        passage holds. With empty `query_text` it is the plain cosine. Passages
        without an embedding are not returned. `total` is how many passages
        were ranked: every embedded one while the archive is searched exactly,
        the candidate pool once an approximate index serves it."""

    @abstractmethod
    async def list_passages(self, agent_id: str, limit: int, offset: int = 0) -> list[Passage]: ...

    @abstractmethod
    async def count_passages(self, agent_id: str) -> int: ...

    @abstractmethod
    async def delete_passages(self, agent_id: str, ids: Sequence[int]) -> None: ...

    # -- shared collections -----------------------------------------------
    # A collection ("source") is stored once, as an agent record keyed
    # `source:NAME` that holds its passages, so every archival call above
    # works on it unchanged. Agents only ever read it, through
    # ArchivalMemory.search, which merges the attached collections in.
    # Not abstract yet so a backend still being written keeps working (with no
    # collections); the conformance suite (test_sources_conformance) holds
    # every backend to these.
    async def create_source(self, name: str) -> tuple[SourceRecord, bool]:
        """The collection `name`, created if new (with its `source:NAME` agent
        record); the bool says whether this call created it. Safe under
        concurrent calls for the same name."""
        raise self._no_sources()

    async def find_source(self, name: str) -> SourceRecord | None:
        raise self._no_sources()

    async def list_sources(self) -> list[SourceRecord]:
        """Admin: every collection, by name."""
        raise self._no_sources()

    async def attach_source(self, source_id: str, agent_id: str | None) -> None:
        """Let one agent search the collection; with None, every agent, present
        and future (this also undoes earlier per-agent detaches)."""
        raise self._no_sources()

    async def detach_source(self, source_id: str, agent_id: str | None) -> None:
        """Stop one agent searching the collection, even if it is attached to
        all; with None, detach it from every agent."""
        raise self._no_sources()

    async def attached_sources(self, agent_id: str) -> list[SourceRecord]:
        """The collections this agent searches, by name: attached to it, or
        to all agents and not detached from it. Never the agent itself."""
        return []

    async def source_attachments(self, source_id: str) -> list[str]:
        """Admin: ids of the agents the collection is attached to one by one
        (agents covered only by `attach_all` are not listed)."""
        raise self._no_sources()

    # -- loaded documents (any agent, collections included) ---------------
    async def record_document(self, agent_id: str, document: DocumentRecord) -> None:
        """Mark a file as completely loaded (insert or replace by sha256).
        Written only after all its passages are stored, so a load that was
        interrupted before this call is resumed by loading the file again."""
        raise self._no_sources()

    async def list_documents(self, agent_id: str) -> list[DocumentRecord]:
        """Files completely loaded for this agent, oldest first."""
        raise self._no_sources()

    async def known_passage_hashes(self, agent_id: str, hashes: Sequence[str]) -> set[str]:
        """Which of `hashes` belong to passages this agent already holds."""
        raise self._no_sources()

    async def insert_hashed_passages(
        self, agent_id: str, passages: Sequence[Passage], hashes: Sequence[str]
    ) -> list[int]:
        """Like insert_passages, keyed by content hash (one per passage): a
        passage whose hash the agent already holds (or that repeats one earlier
        in the call) is skipped and gets id 0; the others are stored and their
        hashes recorded. Deleting a passage forgets its hash."""
        raise self._no_sources()

    def _no_sources(self) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} does not support shared collections and loading yet")

    # -- coordination between bot processes ---------------------------------
    # What lets several bot processes share one database: platform events
    # delivered more than once (Slack retries) are handled once, and one agent
    # is worked on by one process at a time, in arrival order (bot/leases.py
    # tells the protocol). Not abstract, like shared collections; the
    # conformance suite (test_dedup_conformance, test_lease_conformance) holds
    # every backend to these. Times are the store's clock, in seconds.
    async def first_delivery(self, event_id: str) -> bool:
        """True the first time `event_id` is seen by any process on this
        database, False for every repeat within DEDUP_TTL (a day); an id
        older than that counts as new again."""
        raise self._no_coordination()

    async def lease_register(self, owner: str, ttl: float) -> None:
        """Start the heartbeat of a new lease owner (a bot process; the id is
        never used again once it expires): alive for `ttl` seconds."""
        raise self._no_coordination()

    async def lease_renew(self, owner: str, ttl: float) -> bool:
        """Keep `owner` alive for another `ttl` seconds from now. False when it
        already expired (or was never registered): it can never come back,
        and every ticket it holds is dead."""
        raise self._no_coordination()

    async def lease_join(self, name: str, owner: str) -> int:
        """Take a ticket for `name` (an agent key): its place in that name's
        line, after every ticket already taken. Returns its number."""
        raise self._no_coordination()

    async def lease_position(self, name: str, seq: int, owner: str) -> int | None:
        """How many live tickets are ahead of ticket `seq` (reads): 0 means it
        holds the lease. A ticket is live until it is done or its owner's
        heartbeat expires. None when the ticket itself is not live. May clear
        away dead tickets ahead of it."""
        raise self._no_coordination()

    async def lease_leave(self, name: str, seq: int, owner: str) -> None:
        """Done with ticket `seq` (held, given up or lost): it no longer
        counts. Now and then also clears away the name's done tickets, but
        never its highest-numbered one (bot/leases.py says why)."""
        raise self._no_coordination()

    async def lease_swap_holder(self, name: str, holder: str) -> str | None:
        """Record `holder` as the last one to hold `name` and return the one
        recorded before (None if never; `holder` itself if it was already
        recorded: nothing is written then). Called only by the lease holder."""
        raise self._no_coordination()

    def _no_coordination(self) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} cannot coordinate several bot processes")


DEDUP_TTL = 24 * 60 * 60  # seconds an event id is remembered by first_delivery


SOURCE_KEY_PREFIX = "source:"


def source_key(name: str) -> str:
    """The agent key under which a collection's passages are stored."""
    return SOURCE_KEY_PREFIX + name


@dataclass(slots=True)
class SourceRecord:
    """A shared collection. `id` is the id of the agent record holding its
    passages; `attach_all` attaches it to every agent, present and future."""

    id: str
    name: str
    created_at: datetime
    attach_all: bool = False


@dataclass(slots=True)
class DocumentRecord:
    """A file loaded completely into an agent's (or a collection's) archival storage."""

    sha256: str
    name: str
    passages: int
    loaded_at: datetime
