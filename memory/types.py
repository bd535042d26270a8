"""Plain data records shared by the memory layer and its storage backends."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


# The time now, in UTC: a partial, not a function of ours, so that the many records
# stamped on one event's way (each Message) make no Python call for it.
utc_now = functools.partial(datetime.now, UTC)


@dataclass(slots=True)
class Message:
    """One item of recall storage, in OpenAI chat shape.

    `seq` is assigned by the store on append (1, 2, 3 ... per agent) and is the
    total order of an agent's history: the FIFO queue is always a suffix of it.
    `name` is internal (the kind of event or the function called) and is not sent
    to the model: several OpenAI-compatible servers reject it.
    """

    role: Role
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    created_at: datetime = field(default_factory=utc_now)
    seq: int = 0
    # The inbound event this message records (user messages only): a redone
    # event finds it and is not recorded twice. Internal, never sent to the model.
    event_id: str | None = None
    # The conversation it belongs to (memory/places.py: "dm", "private:<id>",
    # "public:<id>"); reads filter on it (Visibility).
    place: str = "dm"
    # A channel memory's line (memory/channels.py): who said it (their agent
    # key, and their display name then) and when the platform last edited it.
    # None / "" in an agent's own recall, whose speaker its role tells.
    speaker: str | None = None
    speaker_name: str = ""
    edited_at: datetime | None = None
    # What the model reads now when it differs from the content recall keeps: a
    # search result holding a channel's lines, which are readable only in that
    # channel (bot/channels/recall.py). Never stored; None: the content.
    shown: str | None = None

    def calls(self, name: str) -> bool:
        """Whether this (assistant) step called the function `name`."""
        return any((call.get("function") or {}).get("name") == name for call in self.tool_calls or ())

    def said_text(self) -> str:
        """The content as it was said: a channel line opens with its speaker's
        name ("alice: ..."), as conversation search reads a speaker and as it
        is embedded."""
        content = self.content or ""
        return f"{self.speaker_name}: {content}" if self.speaker_name and content else content

    def searchable_text(self) -> str:
        """Text that recall search indexes: the content (as said) plus any call arguments."""
        parts = [self.said_text()]
        for call in self.tool_calls or []:
            function = call.get("function", {})
            parts.append(f"{function.get('name', '')} {function.get('arguments', '')}")
        return "\n".join(part for part in parts if part)

    def tool_calls_json(self) -> str | None:
        return json.dumps(self.tool_calls) if self.tool_calls else None


# The place key of working-context text set by the operator (the default
# persona, a block's placeholder): not said anywhere, shown everywhere.
OPERATOR_KEY = "operator"


def new_line_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True, slots=True)
class BlockLine:
    """One line of a working-context block and where it came from.

    `place` is the conversation key it was written from (memory/places.py:
    "dm", "private:<id>", "public:<id>"; OPERATOR_KEY for the operator's
    text); it decides where the line is shown (memory/working_context.py),
    unless `shared` (the person made it visible everywhere). `id` is stable
    for the line's life: what `/memory` names it by."""

    text: str
    place: str = "dm"
    written_at: datetime = field(default_factory=utc_now)
    id: str = field(default_factory=new_line_id)
    shared: bool = False
    # Whose message the line came from, by agent key, in a channel's notes (the
    # `channel` block of its memory): forgetting that person removes it. "" elsewhere.
    speaker: str = ""
    speaker_name: str = ""  # their display name then, shown with the line

    def record(self) -> dict[str, Any]:
        """The line as both backends store it (times in microseconds, as MongoDB keeps every time)."""
        return {
            "id": self.id,
            "text": self.text,
            "place": self.place,
            "written_at": round(self.written_at.timestamp() * 1_000_000),
            "shared": self.shared,
            **({"speaker": self.speaker} if self.speaker else {}),
            **({"speaker_name": self.speaker_name} if self.speaker_name else {}),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> BlockLine:
        written = datetime.fromtimestamp(record["written_at"] / 1_000_000, UTC)
        shared = bool(record.get("shared", False))
        speaker, name = str(record.get("speaker", "")), str(record.get("speaker_name", ""))
        return cls(record["text"], record["place"], written, record["id"], shared, speaker, name)


def text_lines(text: str, place: str, written_at: datetime | None = None) -> list[BlockLine]:
    """`text` as block lines written from `place` (one per non-empty line)."""
    when = written_at or utc_now()
    return [BlockLine(line, place, when) for line in text.split("\n") if line.strip()]


@dataclass(slots=True, init=False)
class Block:
    """A labelled, size-limited piece of working context (e.g. persona, human):
    its lines, each with the place it was written from. `value` is the whole
    text, as a DM sees it; other places see less (memory/working_context.py)."""

    label: str
    limit: int
    lines: list[BlockLine]
    updated_at: datetime

    def __init__(
        self,
        label: str,
        value: str = "",
        limit: int = 0,
        updated_at: datetime | None = None,
        *,
        lines: Sequence[BlockLine] | None = None,
        place: str = "dm",
    ) -> None:
        """A block of `lines`, or of `value`'s lines written from `place` (the DM: the safe side)."""
        self.label = label
        self.limit = limit
        self.updated_at = updated_at or utc_now()
        self.lines = list(lines) if lines is not None else text_lines(value, place, self.updated_at)

    @property
    def value(self) -> str:
        return join_lines(self.lines)

    def lines_json(self) -> str:
        return json.dumps([line.record() for line in self.lines], ensure_ascii=False)

    @staticmethod
    def lines_from_json(text: str) -> list[BlockLine]:
        return [BlockLine.from_record(record) for record in json.loads(text)]


def join_lines(lines: Iterable[BlockLine]) -> str:
    return "\n".join(line.text for line in lines)


@dataclass(slots=True)
class Passage:
    """An archival storage item. `embedding` is None until computed."""

    text: str
    id: int = 0
    source: str | None = None
    position: str | None = None
    created_at: datetime = field(default_factory=utc_now)
    embedding: list[float] | None = None
    # Where it was saved (a conversation key, memory/places.py); reads filter on it.
    place: str = "dm"


@dataclass(slots=True)
class AgentRecord:
    """What the store keeps about an agent besides its messages and passages
    (its queues and summaries are per place: ConversationRecord)."""

    id: str
    key: str
    created_at: datetime = field(default_factory=utc_now)


@dataclass(slots=True)
class ConversationRecord:
    """One place's conversation with an agent: its FIFO queue state.

    `place` is the conversation key (memory/places.py). The queue of a place is
    that place's messages with seq >= `queue_start_seq`; its messages before it
    were evicted and live on only in recall storage and in the recursive
    `summary`. `name` is the place's display name, for people and the model.
    """

    agent_id: str
    place: str
    name: str = ""
    summary: str = ""
    queue_start_seq: int = 1
    summary_updated_at: datetime | None = None


@dataclass(slots=True)
class SearchPage:
    """One page of search results plus the total count, for paging."""

    items: list[Any]
    total: int


# -- what the storage roles exchange besides memory (memory/roles.py) ----------
SOURCE_KEY_PREFIX = "source:"


def source_key(name: str) -> str:
    """The agent key under which a collection's passages are stored."""
    return SOURCE_KEY_PREFIX + name


# A channel's memory (memory/channels.py) is stored as the recall of an agent keyed so.
CHANNEL_KEY_PREFIX = "channel:"
# Agent records that are nobody's memory: listings of people leave them out.
PSEUDO_AGENT_PREFIXES = (SOURCE_KEY_PREFIX, CHANNEL_KEY_PREFIX)


def prefix_end(prefix: str) -> str:
    """Where keys starting with `prefix` end: they sort in [prefix, prefix_end(prefix)), a range an index serves."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def is_person_key(key: str) -> bool:
    """Whether an agent key is a person's, not a collection's or a channel's."""
    return not key.startswith(PSEUDO_AGENT_PREFIXES)


@dataclass(slots=True)
class ChannelLine:
    """One message said in a channel, as the channel's memory keeps it.

    `channel` is the channel key (memory/channels.py: platform, workspace or
    guild, channel id; a thread's messages are its channel's), `message_id`
    the platform's id of the message (kept once per channel), `speaker` the
    speaker's agent key ("slack:T01:U02") and `speaker_name` their display
    name when they said it. `place` is the conversation key it was said in
    (memory/places.py), `seq` its order in the channel's memory (set by the store)."""

    channel: str
    message_id: str
    speaker: str
    speaker_name: str
    text: str
    said_at: datetime
    place: str
    edited_at: datetime | None = None
    seq: int = 0


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


@dataclass(slots=True)
class InboxEntry:
    """An inbound event as its adapter received it. `payload` is whatever the
    adapter needs to handle it again (plain JSON); `platform` names the adapter (stored as `origin`)."""

    event_id: str
    platform: str
    agent_key: str
    payload: dict[str, Any]
    received_at: datetime
    # pending: received, not started | running: work on it started | waiting:
    # storage failed it, replayed at next_try_at | done
    state: str = "pending"
    attempts: int = 0  # restarts that found it running
    next_try_at: float = 0.0  # seconds since the epoch, while waiting
    # The event it was debounced into (bot/durable/debounce.py): that event's
    # run records this one's message and answers it. "" when handled on its own.
    absorbed_into: str = ""
    # The bot process (its lease owner id) that received or took over the
    # entry: while that owner lives, no other process replays it. "" with a
    # single process (no leases).
    owner: str = ""
    # A suspect (bot/durable/inbox.py: Quarantine), to run alone, not yet through its
    # steps: a death while it is *running* so is evidence against this event.
    alone: bool = False


@dataclass(slots=True)
class OutboxEntry:
    """One reply on its way out. `id` is "<event id>:<n>": the n-th reply to
    that event, so redoing the event cannot record the same reply twice."""

    id: str
    event_id: str
    position: int
    agent_key: str
    platform: str
    user_id: str
    reply_to: dict[str, Any]
    text: str
    created_at: datetime
    state: str = "pending"  # pending | sent | dropped
    attempts: int = 0
    next_try_at: float = 0.0


@dataclass(slots=True)
class UsageTally:
    """What UsageStore.usage_since found: hits, the sum of their amounts, and the
    times of the oldest and newest (None when there are no hits)."""

    count: int
    amount: int
    oldest: datetime | None
    newest: datetime | None
