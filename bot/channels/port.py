"""What an adapter may ask of the bot about a channel's memory (docs/channel_memory.md).

An adapter reads a channel's mode before it decides what to do with a message
there, and hands every message it reads in a listening or open channel to
`hear` before it acknowledges it to the platform (Slack then delivers it again
if the bot stopped before keeping it). Keeping is idempotent by the platform's
message id, so a re-delivery or a gateway replay keeps a line once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from memory.places import Place

# mention: answer mentions, keep nothing else (the default); listen: keep what the
# channel says, answer only mentions; open: answer every message, and keep them.
Mode = Literal["mention", "listen", "open"]
MODES: tuple[Mode, ...] = ("mention", "listen", "open")


@dataclass(frozen=True, slots=True)
class ChannelRef:
    """One channel of one workspace (a Slack team, a Discord guild); a thread is its channel's."""

    platform: str
    workspace: str  # the workspace or guild the channel belongs to (not the speaker's own team)
    place: Place  # the channel (never a DM)

    @property
    def key(self) -> str:
        """What the channel's memory is stored under, e.g. "slack:T01:C02" (memory/channels.py)."""
        return f"{self.platform}:{self.workspace}:{self.place.id}"


@dataclass(frozen=True, slots=True)
class Heard:
    """One message read in a listening or open channel."""

    channel: ChannelRef
    message_id: str  # the platform's id of the message (Slack: its ts; Discord: its snowflake)
    user_id: str  # the speaker as events name them (Event.user_id): their agent key is platform:user_id
    speaker_name: str  # their display name when they said it
    text: str
    said_at: datetime


class ChannelPort(Protocol):
    """A channel's mode, and its lines as the platform reports them."""

    async def channel_mode(self, channel: ChannelRef, default: Mode) -> Mode:
        """The channel's mode: what a manager set with /channel, else `default` (the operator's setting)."""
        ...

    async def hear(self, heard: Heard) -> str:
        """Keep the line unless its speaker opted out (a repeat is kept once). Returns the
        notice to post in the channel when this is the first line heard since it started
        listening (said once, across processes), else ""."""
        ...

    async def heard_edit(self, channel: ChannelRef, message_id: str, text: str, edited_at: datetime) -> None:
        """The platform says a message was edited: its kept line now says `text`."""
        ...

    async def heard_delete(self, channel: ChannelRef, message_id: str) -> None:
        """The platform says a message was deleted: its kept line goes, with its index entries."""
        ...
