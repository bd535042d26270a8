"""The complete storage backend: every role of memory/roles.py in one type.

`Store` is what the runtime is given and what each backend (SQLite, MongoDB)
is: both play every role and pass the same conformance suite
(tests/conformance, which runs each test on both). Code that needs only part
of a store asks for that role instead (memory/roles.py), so a narrower store
(a test double, a backend still being written) can serve it.

The records the roles exchange live in memory/types.py; they are named here
too, so `from memory.store import InboxEntry` keeps working.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from memory.roles import (
    AgentStore,
    BlockStore,
    ChannelStore,
    DocumentStore,
    InboxStore,
    LeaseStore,
    Lifecycle,
    MessageEmbeddingStore,
    MessageStore,
    PassageStore,
    ScheduleHost,
    SourceStore,
    UsageStore,
)
from memory.types import (
    SOURCE_KEY_PREFIX,
    DocumentRecord,
    InboxEntry,
    OutboxEntry,
    SourceRecord,
    UsageTally,
    source_key,
)

__all__ = [
    "DEDUP_TTL",
    "SOURCE_KEY_PREFIX",
    "DocumentRecord",
    "InboxEntry",
    "OutboxEntry",
    "SourceRecord",
    "Store",
    "StoreError",
    "UsageTally",
    "source_key",
]

DEDUP_TTL = 24 * 60 * 60  # seconds a finished inbox entry (and so its event id) is kept


class StoreError(Exception):
    """A storage failure the caller can report to a person (disk full, locked...)."""


@runtime_checkable
class Store(
    Lifecycle,
    AgentStore,
    BlockStore,
    MessageStore,
    MessageEmbeddingStore,
    ChannelStore,
    PassageStore,
    SourceStore,
    DocumentStore,
    InboxStore,
    LeaseStore,
    UsageStore,
    ScheduleHost,
    Protocol,
):
    """Every role: memory (agents, working context, recall, channel memories, archival), shared
    collections and loaded documents, the inbox and outbox, leases
    between bot processes, usage counters and check-in schedules."""
