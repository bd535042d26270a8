"""The storage roles: one small protocol per thing a store can keep.

A caller asks for the role it needs (`RecallMemory` takes a MessageStore, the
usage limits a UsageStore...), and a backend declares the roles it plays
(memory/sqlite/store.py, memory/mongo/store.py). Where a caller can do without
a role, it checks for it as a type: `isinstance(store, MessageEmbeddingStore)`
(every role is runtime-checkable), never by catching NotImplementedError.
memory/store.py composes them into `Store`, the complete backend the runtime
is given. The shared conformance suite (tests/conformance) holds every backend
to what the docstrings here promise.

Every method that touches memory takes the agent id first: no call reads or
searches across agents, except the admin ones whose names say so
(`list_agents`, `delete_agent`, `list_sources`...).

Places (memory/places.py): every message and passage records the conversation
key it belongs to, and every read of them that takes `visible` (a
Visibility) returns only items whose key it sees: `visible.everything`, or the
key is in `visible.places`, or `visible.public` and the key starts with
"public:". None means everything (admin, CLI, export). The filter is applied
before ranking and paging, so a page and its `total` hold visible items only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from memory.places import DM_KEY, Visibility
from memory.schedules import ScheduleStore
from memory.types import (
    AgentRecord,
    Block,
    ConversationRecord,
    DocumentRecord,
    InboxEntry,
    Message,
    OutboxEntry,
    Passage,
    SearchPage,
    SourceRecord,
    UsageTally,
)


@runtime_checkable
class Lifecycle(Protocol):
    async def open(self) -> None:
        """Connect, create or migrate the schema and indexes (idempotent)."""

    async def close(self) -> None: ...


@runtime_checkable
class AgentStore(Protocol):
    """Agents and their FIFO queue state (admin calls are the only ones that span agents)."""

    async def get_or_create_agent(self, key: str, default_blocks: Sequence[Block]) -> tuple[AgentRecord, list[Block]]:
        """The agent for `key` ("platform:user"), created with `default_blocks`
        on first use. Safe under concurrent calls for the same key."""

    async def find_agent(self, key: str) -> AgentRecord | None: ...

    async def list_agents(self) -> list[AgentRecord]:
        """Admin: every agent, oldest first."""

    async def delete_agent(self, agent_id: str) -> None:
        """Admin / forget: remove the agent and everything stored for it
        (its conversations too)."""

    async def flush_deleted(self) -> None:
        """After a forget: make what was just deleted unreadable from the
        store's own files too (SQLite keeps old pages in its WAL)."""

    async def get_conversation(self, agent_id: str, place: str, name: str = "") -> ConversationRecord:
        """The agent's conversation in `place` (a conversation key), created on
        first use (empty summary, queue_start_seq 1). Safe under concurrent
        calls. A non-empty `name` replaces the stored display name."""

    async def list_conversations(self, agent_id: str) -> list[ConversationRecord]:
        """Every conversation of the agent, by place key."""

    async def update_queue(
        self,
        agent_id: str,
        summary: str,
        queue_start_seq: int,
        summary_updated_at: datetime,
        *,
        place: str = DM_KEY,
    ) -> None:
        """Record an eviction in one place: its new recursive summary and where
        its queue now starts, in one atomic write (the conversation is created
        if it was not yet; StoreError if the agent is unknown)."""


@runtime_checkable
class BlockStore(Protocol):
    """Working context: the agent's labelled blocks, in order."""

    async def load_blocks(self, agent_id: str) -> list[Block]: ...

    async def save_block(self, agent_id: str, block: Block) -> None:
        """Replace one block whole (a single atomic write)."""


@runtime_checkable
class MessageStore(Protocol):
    """Recall storage: every message, in `seq` order, and its search."""

    async def append_messages(
        self,
        agent_id: str,
        messages: Sequence[Message],
        *,
        unless_event: str | None = None,
        replies: Sequence[OutboxEntry] = (),
        after: int | None = None,
    ) -> list[Message]:
        """Store messages in order, in one transaction, assigning each the next
        `seq`. Returns them with `seq` set. With `unless_event`: nothing is
        stored, and [] returned, if the agent has a message of that event id
        already (an earlier run of the event recorded it; see event_message_seq).
        With `replies`: outbox entries (InboxStore.outbox_add) stored first,
        in the same transaction where the backend has one: a step's replies and
        its record in one round trip (the SQLite worker's; bot/agent.py).
        `after`: the agent's newest seq as the caller knows it (it appended that
        one itself, and nobody can have appended since: it holds the agent's
        lease and its copy is current); a backend may then spare reading it. A
        stale value costs a read, never a seq: seqs stay unique and ordered."""

    async def messages_since(self, agent_id: str, seq: int, *, place: str | None = None) -> list[Message]:
        """Messages with `seq >= seq`, oldest first; with `place`, only that
        conversation's (a place's queue)."""

    async def count_messages(self, agent_id: str, *, visible: Visibility | None = None) -> int: ...

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
        """Ranked by relevance to `query` (not bare substring match): BM25.

        With `query_vector` (the embedding of `query`) the ranking is hybrid,
        the archival formula: cosine(query_vector, message embedding) +
        memory.search.hybrid.KEYWORD_WEIGHT x BM25 coverage, over the candidates =
        the best keyword hits (embedded or not: a message without an embedding
        counts cosine 0) and the nearest embedded messages. `total` is the
        number of candidates. Ties go to the lower seq."""

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
        """Messages with start <= created_at < end, oldest first."""

    async def delete_messages(self, agent_id: str, seqs: Sequence[int]) -> int:
        """Selective forget: delete the agent's messages with these seqs, with
        their keyword-index entries and embeddings; returns how many went. The
        other seqs stay as they are (gaps are allowed); counts and searches
        see only what is left."""

    async def event_message_seq(self, agent_id: str, event_id: str) -> int | None:
        """The seq of the agent's message recorded for `event_id` (Message.event_id),
        if any: how a redone event knows its message is already in recall."""


@runtime_checkable
class MessageEmbeddingStore(Protocol):
    """Embeddings of recall messages, computed lazily, only for agents that
    search their recall (memory/recall.py): embedding every message on arrival
    would cost CPU on every chat event. Without this role recall search is by
    keywords alone."""

    async def messages_without_embedding(self, agent_id: str, limit: int) -> list[Message]:
        """Up to `limit` of the agent's messages still without an embedding,
        newest first; only role user or assistant with non-empty content
        (tool results and system alerts are left to keyword search)."""

    async def set_message_embeddings(self, agent_id: str, vectors: Mapping[int, Sequence[float]]) -> None:
        """Attach embeddings to the agent's messages by seq (seqs of other
        agents or unknown ones are ignored); ValueError if their length
        differs from the agent's stored message embeddings."""


@runtime_checkable
class ChannelStore(Protocol):
    """A channel memory (memory/channels.py) is the recall of a pseudo-agent
    keyed CHANNEL_KEY_PREFIX + channel key: lines appended with MessageStore
    (the platform's message id as `event_id` and `unless_event`: kept once),
    each with its `speaker`. This role adds edits and deletions by message id, a
    speaker's lines, counts and consent across channels (deletions take index
    entries and embeddings too, then flush_deleted), and a channel's mode by
    channel key, whose listening notice is claimed once until "mention" re-arms it."""

    async def edit_message(self, agent_id: str, event_id: str, content: str, edited_at: datetime) -> bool:
        """New content for the message of `event_id` (keywords follow, embedding redone); False if none."""

    async def delete_event_messages(self, agent_id: str, event_ids: Sequence[str]) -> int:
        """Delete the agent's messages recorded for these event ids; how many went."""

    async def speaker_messages(self, speaker: str, *, agent_id: str | None = None) -> list[tuple[str, Message]]:
        """Every message of `speaker` (an agent key) in every agent, or in `agent_id`: (agent key, message)s."""

    async def speaker_message_counts(self, speaker: str) -> dict[str, int]:
        """How many messages of `speaker` each agent holds, by agent key (none: absent)."""

    async def delete_speaker_messages(self, speaker: str, *, agent_id: str | None = None) -> int:
        """Delete every message of `speaker` (in every agent, or only in `agent_id`); how many went."""

    async def prune_messages(self, key_prefix: str, before: datetime) -> int:
        """Retention: delete what agents keyed `key_prefix`... (channels) hold from before `before`; how many."""

    async def set_channel_consent(self, speaker: str, keep: bool | None, at: datetime) -> None: ...  # None: default
    async def channel_consent(self, speakers: Collection[str]) -> dict[str, bool]: ...  # only those who chose

    async def list_channel_consent(self) -> list[tuple[str, bool, datetime]]:
        """Every recorded choice, (speaker, keep, set at), by speaker (for cli/migrate.py)."""

    async def set_channel_mode(self, channel: str, mode: str, at: datetime) -> None: ...
    async def channel_mode(self, channel: str) -> str | None: ...  # None: nobody set one
    async def claim_channel_notice(self, channel: str, at: datetime) -> bool: ...  # True once, until re-armed


@runtime_checkable
class PassageStore(Protocol):
    """Archival storage: passages, their embeddings, and their search."""

    async def insert_passages(self, agent_id: str, passages: Sequence[Passage]) -> list[int]:
        """Store passages (embedding may still be None); returns their ids."""

    async def set_embeddings(self, agent_id: str, vectors: dict[int, list[float]]) -> None:
        """Attach computed embeddings to passages by id."""

    async def passages_without_embedding(self, agent_id: str) -> list[Passage]: ...

    async def search_passages(
        self,
        agent_id: str,
        query_text: str,
        query_vector: Sequence[float],
        limit: int,
        offset: int = 0,
        *,
        visible: Visibility | None = None,
    ) -> SearchPage:
        """Embedded passages ranked by a hybrid of meaning and keywords, best
        first (ties by id, so pages never overlap): relevance is the cosine of
        `query_vector` plus a keyword bonus of up to memory.search.hybrid.KEYWORD_WEIGHT
        for how much of `query_text` (rare words, ids, codes, names) the
        passage holds. With empty `query_text` it is the plain cosine. Passages
        without an embedding are not returned. `total` is how many passages
        were ranked: every embedded one while the archive is searched exactly,
        the candidate pool once an approximate index serves it."""

    async def list_passages(
        self, agent_id: str, limit: int, offset: int = 0, *, visible: Visibility | None = None
    ) -> list[Passage]:
        """Oldest first."""

    async def count_passages(self, agent_id: str, *, visible: Visibility | None = None) -> int: ...

    async def delete_passages(self, agent_id: str, ids: Sequence[int]) -> None: ...


@runtime_checkable
class SourceStore(Protocol):
    """Shared collections. A collection ("source") is stored once, as an agent
    record keyed `source:NAME` that holds its passages, so every PassageStore
    call works on it unchanged. Agents only ever read it, through
    ArchivalMemory.search, which merges the attached collections in."""

    async def create_source(self, name: str) -> tuple[SourceRecord, bool]:
        """The collection `name`, created if new (with its `source:NAME` agent
        record); the bool says whether this call created it. Safe under
        concurrent calls for the same name."""

    async def find_source(self, name: str) -> SourceRecord | None: ...

    async def list_sources(self) -> list[SourceRecord]:
        """Admin: every collection, by name."""

    async def attach_source(self, source_id: str, agent_id: str | None) -> None:
        """Let one agent search the collection; with None, every agent, present
        and future (this also undoes earlier per-agent detaches)."""

    async def detach_source(self, source_id: str, agent_id: str | None) -> None:
        """Stop one agent searching the collection, even if it is attached to
        all; with None, detach it from every agent."""

    async def attached_sources(self, agent_id: str) -> list[SourceRecord]:
        """The collections this agent searches, by name: attached to it, or
        to all agents and not detached from it. Never the agent itself."""

    async def source_attachments(self, source_id: str) -> list[str]:
        """Admin: ids of the agents the collection is attached to one by one
        (agents covered only by `attach_all` are not listed)."""


@runtime_checkable
class DocumentStore(Protocol):
    """Loaded documents, for any agent or collection: what makes a load resumable."""

    async def record_document(self, agent_id: str, document: DocumentRecord) -> None:
        """Mark a file as completely loaded (insert or replace by sha256).
        Written only after all its passages are stored, so a load that was
        interrupted before this call is resumed by loading the file again."""

    async def list_documents(self, agent_id: str) -> list[DocumentRecord]:
        """Files completely loaded for this agent, oldest first."""

    async def known_passage_hashes(self, agent_id: str, hashes: Sequence[str]) -> set[str]:
        """Which of `hashes` belong to passages this agent already holds."""

    async def insert_hashed_passages(
        self, agent_id: str, passages: Sequence[Passage], hashes: Sequence[str]
    ) -> list[int]:
        """Like insert_passages, keyed by content hash (one per passage): a
        passage whose hash the agent already holds (or that repeats one earlier
        in the call) is skipped and gets id 0; the others are stored and their
        hashes recorded. Deleting a passage forgets its hash."""


@runtime_checkable
class LeaseStore(Protocol):
    """Coordination between bot processes: one agent is worked on by one
    process at a time, in arrival order (bot/durable/leases.py tells the
    protocol). Times are the store's clock, in seconds."""

    # Whether several bot processes may share the store (MongoDB): leases are then on by default.
    serves_many_processes: bool

    async def lease_register(self, owner: str, ttl: float) -> None:
        """Start the heartbeat of a new lease owner (a bot process; the id is
        never used again once it expires): alive for `ttl` seconds."""

    async def lease_renew(self, owner: str, ttl: float) -> bool:
        """Keep `owner` alive for another `ttl` seconds from now. False when it
        already expired (or was never registered): it can never come back,
        and every ticket it holds is dead."""

    async def lease_join(self, name: str, owner: str) -> int:
        """Take a ticket for `name` (an agent key): its place in that name's
        line, after every ticket already taken. Returns its number."""

    async def lease_position(self, name: str, seq: int, owner: str) -> int | None:
        """How many live tickets are ahead of ticket `seq` (reads): 0 means it
        holds the lease. A ticket is live until it is done or its owner's
        heartbeat expires. None when the ticket itself is not live. May clear
        away dead tickets ahead of it."""

    async def lease_leave(self, name: str, seq: int, owner: str) -> None:
        """Done with ticket `seq` (held, given up or lost): it no longer
        counts. Now and then also clears away the name's done tickets, but
        never its highest-numbered one (bot/durable/leases.py says why)."""

    async def lease_live(self, owners: Collection[str]) -> set[str]:
        """Those of `owners` whose heartbeat has not expired (reads)."""


@runtime_checkable
class InboxStore(Protocol):
    """Crash safety: the inbox and the reply outbox. An inbound event
    is recorded (inbox_receive) before the platform is told it arrived,
    marked "running" when work on it starts, "waiting" (with its next try)
    when storage failed it, and "done" once every reply to it is handed to the
    outbox; a reply is recorded (outbox_add) when the agent sends it and
    marked sent when the platform confirms. A restarted bot redoes the
    unfinished events and re-sends the unsent replies (bot/durable/__init__.py
    tells the protocol)."""

    async def inbox_receive(self, entry: InboxEntry) -> bool:
        """Record an inbound event; True the first time its id is seen (by any
        process), False for a repeat delivery. Done entries are kept
        DEDUP_TTL, so repeats within a day are recognised."""

    async def inbox_update(
        self,
        event_id: str,
        *,
        state: str | None = None,
        attempts: int | None = None,
        next_try_at: float | None = None,
        alone: bool | None = None,
        only_from: Collection[str] = (),
    ) -> bool:
        """Change an entry's state (InboxEntry.state), attempt count, next
        try and/or `alone` mark; with `only_from`, only if its state is one of
        those. Whether an entry was changed (or, with nothing to change, matched)."""

    async def inbox_start(self, event_id: str, *, alone: bool) -> bool:
        """A pending entry becomes running, with its `alone` mark (a waiting one stays waiting).
        True only if it surely never started before: no run of it can have recorded anything
        (False when the store keeps no such mark)."""

    async def inbox_entry(self, event_id: str) -> InboxEntry | None:
        """One entry by its id, whatever its state; None once swept (or never seen)."""

    async def inbox_claim(self, event_id: str, from_owner: str, to_owner: str) -> bool:
        """Take an entry over from `from_owner` (a dead process): True for the
        one caller that did (of any number of processes trying at once), and
        the entry's owner is then `to_owner`."""

    async def inbox_pending(self, platform: str, due_by: float | None = None) -> list[InboxEntry]:
        """Entries from `platform` not yet done, in the order they were received;
        with `due_by`, only the "waiting" ones whose next try is at or before it."""

    async def inbox_absorb(self, leader_id: str, event_ids: Sequence[str]) -> None:
        """Link `event_ids` to the entry they were debounced into
        (InboxEntry.absorbed_into): the leader's run records and answers
        them (bot/durable/debounce.py). A `leader_id` of "" unlinks them: each
        is an event of its own again (Inbox.answered_with_its_batch)."""

    async def outbox_add(self, entry: OutboxEntry) -> bool:
        """Record a reply (id unique); False, and nothing changes, if that id
        is already there (a redo of the same send)."""

    async def outbox_update(
        self, entry_id: str, *, state: str, attempts: int | None = None, next_try_at: float | None = None
    ) -> None:
        """Mark a reply "sent", "dropped" (undeliverable) or "pending" (a retry
        at `next_try_at`, seconds since the epoch)."""

    async def outbox_for_event(self, event_id: str) -> list[OutboxEntry]:
        """Every reply recorded for one event, in the order they were sent."""

    async def outbox_pending(self, platform: str, due_by: float | None = None) -> list[OutboxEntry]:
        """Replies to `platform` not yet confirmed (nor dropped), oldest first;
        with `due_by`, only those whose next try is at or before it."""

    async def inbox_scrub(self, agent_key: str, *, forgotten_at: datetime | None = None) -> None:
        """After a forget: the words of one user's finished events go, their ids
        and states stay (a repeat delivery is still dropped for DEDUP_TTL). The
        payload of each of their "done" entries becomes {} and the text of each
        reply no longer pending (sent, dropped) "". Unfinished entries and
        pending replies are left whole: a replay and a retry need them.
        `forgotten_at`: the user was forgotten whole then; their entries and
        replies received before it go the same way, unfinished ones included
        (made "done", a pending reply "dropped": never replayed nor sent), and
        name nobody any more (agent key, user id and where to reply emptied)."""


@runtime_checkable
class UsageStore(Protocol):
    """Usage limits (bot/limits.py): per-user message rate and daily token
    budget, counted here so that they hold across bot processes. Every hit is
    its own row/document, counted or summed over a time window:
    MongoDB-compatible servers without atomic updates (FerretDB) lose
    concurrent `$inc`s, never inserts. Keyed by agent key ("platform:user"),
    not agent id, so forgetting a user's memory and their counters are
    separate calls (Runtime.forget makes both). Times are the caller's clock."""

    async def record_usage(self, key: str, hits: Mapping[str, int], at: datetime) -> None:
        """Count one hit of each kind in `hits` ("message", "tokens", ...), worth
        its amount, for `key`, in one write (an event's token counts are four)."""

    async def usage_since(self, key: str, kind: str, since: datetime) -> UsageTally:
        """The hits of `kind` for `key` at or after `since`: how many, the sum of
        their amounts, the oldest and the newest time (None when there are none)."""

    async def usage_windows(self, key: str, windows: Sequence[tuple[str, datetime]]) -> list[UsageTally]:
        """`usage_since` of each (kind, since) in `windows`: what admitting an
        event reads, in one round trip (one query)."""

    async def prune_usage(self, before: datetime) -> int:
        """Housekeeping: delete every key's hits older than `before`; returns how many."""

    async def delete_usage(self, key: str) -> int:
        """Delete every hit of `key` (reset, forget); returns how many. An
        exemption stays: it is the admin's setting, not the user's data."""

    async def set_usage_exempt(self, key: str, exempt: bool, at: datetime) -> bool:
        """Exempt `key` from the limits (or not); returns whether this changed anything."""

    async def usage_exempt(self, key: str) -> bool: ...

    async def list_usage_exempt(self) -> list[str]:
        """Admin: every exempt key, sorted."""


@runtime_checkable
class ScheduleHost(Protocol):
    """A store that keeps check-in schedules beside memory, in the same
    database: it picks its own ScheduleStore (memory/schedules.py)."""

    @property
    def schedules(self) -> ScheduleStore: ...
