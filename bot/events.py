"""Typed events: everything that wakes an agent, and the replies it produces.

Adapters build events from platform payloads and deliver replies; they never
see memory. Each event renders itself as one line of text for the queue.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

# Re-exported: adapters take Place from here, never from memory/.
from memory.places import DM as DM
from memory.places import Place as Place
from memory.places import PlaceKind as PlaceKind
from memory.types import utc_now


def agent_key(platform: str, user_id: str) -> str:
    """The one persistent agent per (platform, user): e.g. "slack:T01:U02"."""
    return f"{platform}:{user_id}"


def parse_user(spec: str) -> tuple[str, str]:
    """`--user alice` (a terminal user) or `--user discord:1234` / `slack:T01:U02`."""
    platform, sep, user_id = spec.partition(":")
    if not sep:
        return "terminal", spec
    if not platform or not user_id:
        raise ValueError(f"bad user {spec!r}: use NAME or PLATFORM:ID, e.g. discord:1234")
    if platform == "source":  # shared collections live under source:NAME and are read-only
        raise ValueError(f"bad user {spec!r}: 'source:' names a shared collection, not a user")
    return platform, user_id


def stamp(moment: datetime) -> str:
    """A time as an event's line opens with it."""
    return moment.strftime("%Y-%m-%d %H:%M %Z").strip()


@dataclass(kw_only=True)
class Event:
    platform: str
    user_id: str
    created_at: datetime = field(default_factory=utc_now)
    event_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Where replies go, opaque to the runtime (a channel id, a thread ts...).
    reply_to: dict[str, Any] = field(default_factory=dict)
    # Where a reply reaches the person alone (their DM), for what must not go
    # to a channel: a reminder set there wakes the agent in the DM, with all it
    # knows (bot/checkins/functions.py). Adapters set it; empty: unknown.
    dm_reply_to: dict[str, Any] = field(default_factory=dict)
    # It has an inbox row: redone after a crash (bot/durable/). Set by the
    # pipeline for the events it recorded (adapters/pipeline.py).
    in_inbox: bool = False
    # Its replies go through the outbox with no inbox row of its own: a check-in
    # tick (a check-in written is delivered, even across a crash or a failed send).
    outbox_only: bool = False
    # The inbox entry the event came in as (several events may share one: a
    # message with files); the event's own id when not given.
    inbox_id: str = ""
    # Where it happened: its conversation, and what the agent may read there
    # (memory/places.py). Adapters set it; a check-in tick happens in the DM.
    place: Place = DM
    # Its inbox entry never started before (Inbox.started): no earlier run recorded its message.
    first_run: bool = field(default=False, repr=False, compare=False)
    # Its agent's key (agent_key()), worked out once: it is read at every gate of the event's way.
    agent_key: str = field(init=False, repr=False, compare=False, default="")
    kind = "event"

    def __post_init__(self) -> None:
        self.inbox_id = self.inbox_id or self.event_id
        self.agent_key = agent_key(self.platform, self.user_id)

    @property
    def replies_in_outbox(self) -> bool:
        """Each reply is recorded in the outbox before it is sent, and sent once (bot/durable/outbox.py)."""
        return self.in_inbox or self.outbox_only

    def reply(self, text: str, *, event_id: str | None = None) -> Reply:
        """A reply addressed like this event (not in the outbox: see Agent.send)."""
        return Reply(text, self.platform, self.user_id, self.reply_to, event_id or self.event_id)

    def render(self) -> str:
        raise NotImplementedError

    def members(self) -> list[Event]:
        """The events handled as this one: itself, and what was debounced into it."""
        return [self]


@dataclass(frozen=True, slots=True)
class ChannelLine:
    """One recent message of the channel an agent was mentioned in: context
    for that call only, never stored in the person's memory."""

    author: str
    text: str
    created_at: datetime
    from_bot: bool = False
    # The author's id as the platform's events carry it (an event's user_id): it
    # tells the asker's own lines from other people's (bot/channel_context.py).
    author_id: str = ""


@dataclass(kw_only=True)
class UserMessage(Event):
    text: str
    display_name: str = ""
    channel: str = ""
    # The workspace or guild the place belongs to (a Slack team receiving the event, a
    # Discord guild id); "" in a DM. With the place it names the channel's memory
    # (bot/channels/port.py ChannelRef). Adapters set it.
    workspace: str = ""
    # The last messages of the channel or thread before this one (oldest
    # first), read by the adapter with the bot's own permissions; empty in a DM.
    channel_context: list[ChannelLine] = field(default_factory=list)
    # The same person's next messages in the same place, sent within
    # MEMGPT_DEBOUNCE_SECONDS: handled with this one as one event, answered
    # under its id (bot/durable/debounce.py).
    followers: list[UserMessage] = field(default_factory=list)
    kind = "user_message"

    def members(self) -> list[Event]:
        return [self, *self.followers]

    def render(self) -> str:
        who = self.display_name or "user"
        # The adapter's wording of where (Discord adds the server), else the place's name;
        # nothing in a DM.
        channel = self.channel or ("" if self.place.is_dm else self.place.name or self.place.id)
        where = f" in {channel}" if channel else ""
        return f"[{stamp(self.created_at)}] {who}{where}: {self.text}"


@dataclass(kw_only=True)
class UserJoined(Event):
    display_name: str = ""
    # What they joined, in words ("the Gardeners server"); not `place`, the
    # conversation the event belongs to (a greeting goes to their DM).
    joined: str = ""
    kind = "user_joined"

    def render(self) -> str:
        who = self.display_name or "The person"
        return f"[{stamp(self.created_at)}] [event] {who} joined {self.joined or 'a space where you live'}."


@dataclass(kw_only=True)
class FileUploaded(Event):
    """A file a user shared. Adapters pass the raw bytes; the runtime extracts
    the text and loads it into archival storage before the agent sees the event."""

    filename: str
    data: bytes = b""
    content_type: str = ""
    text: str = ""  # already-extracted text, if the adapter has it
    display_name: str = ""
    kind = "file_uploaded"
    # Filled in by the runtime.
    passages_saved: int = 0
    load_error: str = ""

    def render(self) -> str:
        who = self.display_name or "The person"
        if self.load_error:
            return (
                f"[{stamp(self.created_at)}] [event] {who} uploaded the file {self.filename!r}, "
                f"but it could not be read: {self.load_error}"
            )
        return (
            f"[{stamp(self.created_at)}] [event] {who} uploaded the file {self.filename!r}; "
            f"its text was saved to archival storage as {self.passages_saved} passages "
            "(search it with archival_memory_search)."
        )


@dataclass(kw_only=True)
class ScheduledTick(Event):
    reason: str
    local_time: str = ""
    since_last_conversation: str = ""
    kind = "scheduled_tick"

    def render(self) -> str:
        parts = [f"[{stamp(self.created_at)}] [scheduled tick] {self.reason}."]
        if self.local_time:
            parts.append(f"Their local time: {self.local_time}.")
        if self.since_last_conversation:
            parts.append(f"Last conversation: {self.since_last_conversation} ago.")
        parts.append("Message them with send_message only if it is worth it; silence is fine.")
        return " ".join(parts)


@dataclass(slots=True)
class Reply:
    """A text the agent sent with send_message, addressed like its event."""

    text: str
    platform: str
    user_id: str
    reply_to: dict[str, Any]
    event_id: str
    # Its outbox entry ("" when not durable): report the delivery to the bot.
    outbox_id: str = ""
    # It may have reached the platform before (a crash or an unclear failure
    # came between): the adapter checks before sending it again.
    resend: bool = False
    attempts: int = 0  # failed sends so far (bot/durable/outbox.py)
    # Its agent's key, worked out once: the delivery lanes and the outbox read it.
    agent_key: str = field(init=False)

    def __post_init__(self) -> None:
        self.agent_key = agent_key(self.platform, self.user_id)


class Delivery(Enum):
    """How sending one reply went, as an adapter reports it."""

    SENT = "sent"
    RETRY = "retry"  # a failure worth trying again (network, 5xx, rate limit)
    UNDELIVERABLE = "undeliverable"  # the person left, blocked the bot, or the place is gone


@dataclass(slots=True)
class Redo:
    """An event the inbox hands back to its adapter to handle again: left
    unfinished by a crash, or waiting since storage failed it."""

    event_id: str
    payload: dict[str, Any]  # what the adapter recorded with it
    # Set when the event is given up (the bot stopped every time it ran it):
    # send the person this instead of redoing it, then mark it finished.
    notice: str = ""
