"""conversation_search from a channel: the agent's own recall and what the
channel's members said there (its memory: memory/channels.py), in one ranking.

Scope. The channel is the current event's (`channel_of`: its platform, its
workspace or guild, its channel; a thread's is its channel's), never a
model's argument: no call can read another channel's memory, another
workspace's, or a DM's (a DM has none). A result holding a channel's lines is
shown to the model for this step only; what the agent's recall keeps of it
names no line (`kept`), since the agent's recall is read from its other places
too, and the channel's lines are readable only in that channel.

Ranking. Each source is ranked by conversation search; the two are merged
alternately, the channel's first (a question asked in a channel is most
often about it). Merged position k depends on the first k of each list only,
so page p is read from the first (p+1) pages of both: pages never overlap
or skip. The current message is no hit: neither its record in the asker's
recall (by event id) nor its line in the channel's memory (the asker's line
with the event's message id or time: Discord's event id is the message id,
Slack's message time is the event's time).
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.channels.port import ChannelRef
from bot.events import Event, UserMessage, stamp
from memory.channels import ChannelMemory
from memory.places import Visibility
from memory.recall import RecallMemory
from memory.types import ChannelLine, Message

ASKER = "the person you are answering"
# Said once above the hits, when some come from the channel's memory.
SPEAKERS_NOTE = (
    "Lines '<name> said in {where}' are from the channel's memory: each is its speaker's words. "
    "Save what others said under their name, never as this person's."
)
KEPT = "(a line of {where}'s memory: shown only there)"


def channel_of(event: Event | None) -> str | None:
    """The key of the channel memory an event may read: its channel's, when it
    happened in a channel of a known workspace; None otherwise (a DM, a tick)."""
    if not isinstance(event, UserMessage) or event.place.is_dm or not event.workspace or not event.place.id:
        return None
    return ChannelRef(event.platform, event.workspace, event.place).key


@dataclass(slots=True)
class Found:
    """A merged page: the hits in order (Message: the asker's recall; ChannelLine: the channel's) and the total."""

    items: list[Message | ChannelLine]
    total: int


async def search_both(
    recall: RecallMemory,
    channels: ChannelMemory,
    *,
    agent_id: str,
    visible: Visibility,
    channel: str,
    event: Event,
    query: str,
    page: int,
    size: int,
) -> Found:
    """Page `page` of the merged ranking (see the module's docstring)."""
    members = event.members()
    wanted = (page + 1) * size + len(members)  # room for the current message's records, dropped below
    own = await recall.search(agent_id, query, wanted, 0, visible=visible)
    theirs = await channels.search(channel, query, wanted, 0)
    events = {member.event_id for member in members}
    times = {member.created_at for member in members}
    mine = [m for m in own.items if m.event_id not in events]
    said = [
        line
        for line in theirs.items
        if not (line.speaker == event.agent_key and (line.message_id in events or line.said_at in times))
    ]
    total = own.total - (len(own.items) - len(mine)) + theirs.total - (len(theirs.items) - len(said))
    merged: list[Message | ChannelLine] = []
    for index in range(max(len(mine), len(said))):
        merged += said[index : index + 1]
        merged += mine[index : index + 1]
    return Found(merged[page * size : (page + 1) * size], total)


def line_text(line: ChannelLine, asker: str, where: str) -> str:
    """A channel hit, its speaker explicit: the asker's own marked as theirs."""
    who = line.speaker_name or "someone"
    if line.speaker == asker:
        who = f"{who} ({ASKER})"
    edited = " (edited)" if line.edited_at else ""
    return f"[{stamp(line.said_at)}] {who} said in {where}{edited}: {line.text}"


def kept_text(where: str) -> str:
    return KEPT.format(where=where)
