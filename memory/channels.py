"""Channel memory: what the members of a channel said there, kept for that
channel alone, each line with its speaker, and each speaker's consent.

Storage. A channel's memory is the recall storage of a pseudo-agent keyed
CHANNEL_KEY_PREFIX + channel key (as a shared collection is an agent keyed
`source:NAME`), and each line is a recall message of it with a speaker
(Message.speaker, speaker_name, edited_at: one column or field each). Chosen
over a table of its own because everything a line needs recall already has,
on both stores, tested: seq order, exactly once (the platform's message id is
the message's `event_id`, appended with `unless_event`), keyword indexes (FTS5
rows, MongoDB terms), embeddings and their batched background filling
(memory/recall.py), conversation search's ranking with a ConversationIndex
per agent (whose speaker signal reads the "name: " that Message.said_text puts
before a line), deletion with index entries and embeddings, and the copy
between stores (cli/migrate.py). What a channel needs beyond that is the
ChannelStore role (memory/roles.py): edits and deletions by message id, a
speaker's lines across channels, retention, consent. A channel memory's agent
record holds one block, the channel's notes (memory/channel_notes.py).

Scope. Every read names one channel key, which holds the platform and the
workspace or guild (`channel_key`): nothing of another channel, workspace or
platform is ever searched. A thread's lines are its channel's.

Embedding. `keep` only appends (one write); the line is embedded later, in
batches, by RecallMemory.embed_later on the embedder's thread. A search
embeds what is still pending first, with its query, as recall search does.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from cachetools import TTLCache

from memory.places import Place
from memory.recall import RecallMemory
from memory.store import Store
from memory.types import CHANNEL_KEY_PREFIX, ChannelLine, Message, SearchPage, utc_now

T = TypeVar("T")

# Seconds a channel's background embedding waits for more lines before a batch
# that would not be full: a busy channel's lines are embedded and stored many at
# a time (each batch costs the store a few reads and writes), never one by one.
GATHER = 0.5

# Seconds a channel found without a memory is taken to have none: a search or a
# prompt there costs one store lookup this often, not one per call. A keep in
# this process ends it at once; one in another process is seen within this time.
MISSING_SECONDS = 30.0
MISSING_CACHED = 4_096

# Message.name of a kept line (internal: the kind of item, as for an agent's own events).
LINE_KIND = "channel_line"


def channel_key(platform: str, workspace: str, place: Place) -> str:
    """The memory of the channel `place` is in: "slack:T01:C02" (a thread's
    is its channel's). ValueError for a DM, which has no channel memory."""
    if place.is_dm or not place.id:
        raise ValueError("a direct message has no channel memory")
    return f"{platform}:{workspace}:{place.id}"


def memory_key(channel: str) -> str:
    """The agent key a channel's memory is stored under."""
    return CHANNEL_KEY_PREFIX + channel


def as_message(line: ChannelLine) -> Message:
    return Message(
        role="user",
        content=line.text,
        name=LINE_KIND,
        created_at=line.said_at,
        event_id=line.message_id,
        place=line.place,
        speaker=line.speaker,
        speaker_name=line.speaker_name,
        edited_at=line.edited_at,
    )


def as_line(channel: str, message: Message) -> ChannelLine:
    return ChannelLine(
        channel=channel,
        message_id=message.event_id or "",
        speaker=message.speaker or "",
        speaker_name=message.speaker_name,
        text=message.content or "",
        said_at=message.created_at,
        place=message.place,
        edited_at=message.edited_at,
        seq=message.seq,
    )


class ChannelMemory:
    """Every channel's memory, over one store (both backends alike)."""

    def __init__(self, store: Store, recall: RecallMemory) -> None:
        self.store = store
        self.recall = recall
        # channel key -> its memory's agent id (never changes while the record lives).
        self._ids: dict[str, str] = {}
        # Channels looked up lately and found without a memory (MISSING_SECONDS).
        self._missing: TTLCache[str, bool] = TTLCache(MISSING_CACHED, MISSING_SECONDS)

    async def memory_id(self, channel: str, *, create: bool = False) -> str | None:
        """The channel memory's agent id (channel notes are its blocks: memory/channel_notes.py);
        None while nothing was kept there, unless `create` makes its record."""
        return await (self._new_memory_id(channel) if create else self._memory_id(channel))

    async def _memory_id(self, channel: str, *, trust_a_miss: bool = True) -> str | None:
        """The channel memory's agent id; None while nothing was kept there
        (a miss is remembered for MISSING_SECONDS, unless not to be trusted:
        an edit or deletion that another process's keep may have made apply)."""
        known = self._ids.get(channel)
        if known is None:
            if trust_a_miss and channel in self._missing:
                return None
            record = await self.store.find_agent(memory_key(channel))
            if record is None:
                self._missing[channel] = True
                return None
            known = self._ids[channel] = record.id
        return known

    async def _new_memory_id(self, channel: str) -> str:
        known = self._ids.get(channel)
        if known is None:
            record, _ = await self.store.get_or_create_agent(memory_key(channel), ())
            known = self._ids[channel] = record.id
            self._missing.pop(channel, None)
        return known

    # -- what the channel says ------------------------------------------------
    async def keep(self, line: ChannelLine) -> bool:
        """Keep a line in its channel's memory: False if that message id was
        kept there before (a re-delivery, a replay). Its embedding is left to
        the background."""
        memory_id = await self._new_memory_id(line.channel)
        stored = await self.store.append_messages(memory_id, [as_message(line)], unless_event=line.message_id)
        if stored:
            line.seq = stored[0].seq
            self.recall.embed_later(memory_id, GATHER)
        return bool(stored)

    async def keep_with_consent(self, line: ChannelLine, default: bool = True, *, asked: bool = False) -> bool:
        """Keep `line` if its speaker lets channels keep what they say (their
        recorded choice, else `default`; `asked`: the caller knows they did, from
        a cache). A choice of "off" recorded while the line was being appended
        takes it out again: an opt-out writes its choice before deleting, so
        whichever of the two comes second sees the other, and no line of theirs
        outlives it."""
        if not asked and not (await self.consent([line.speaker])).get(line.speaker, default):
            return False
        if not await self.keep(line):
            return False
        if not (await self.consent([line.speaker])).get(line.speaker, default):
            await self.delete(line.channel, line.message_id)
            return False
        return True

    async def edit(self, channel: str, message_id: str, text: str, edited_at: datetime) -> bool:
        """A platform edit: the line's new text (searched and embedded anew). False if it was never kept."""
        memory_id = await self._memory_id(channel, trust_a_miss=False)
        if memory_id is None or not await self.store.edit_message(memory_id, message_id, text, edited_at):
            return False
        self.recall.embed_later(memory_id, GATHER)
        return True

    async def delete(self, channel: str, message_id: str) -> bool:
        """A platform deletion: the line goes whole. False if it was never kept."""
        return await self._delete_lines(channel, [message_id]) > 0

    async def search(self, channel: str, query: str, limit: int, offset: int = 0) -> SearchPage:
        """The channel's lines (ChannelLine items) ranked by conversation search,
        best first: nothing of any other channel. The caller marks the asker's own."""
        memory_id = await self._memory_id(channel)
        if memory_id is None:
            return SearchPage(items=[], total=0)
        page = await self.recall.search(memory_id, query, limit, offset)
        return SearchPage(items=[as_line(channel, message) for message in page.items], total=page.total)

    async def settle(self, channel: str) -> None:
        """Wait until the channel's lines kept so far are embedded (tests, benchmarks)."""
        memory_id = await self._memory_id(channel)
        if memory_id is not None:
            await self.recall.settle(memory_id)

    # -- what a speaker decides -----------------------------------------------
    async def speaker_lines(self, speaker: str, channel: str | None = None) -> list[ChannelLine]:
        """Every line of `speaker` (an agent key) in every channel, or in one, by channel and order."""
        memory_id = None if channel is None else await self._memory_id(channel)
        if channel is not None and memory_id is None:
            return []
        found = await self.store.speaker_messages(speaker, agent_id=memory_id)
        return [as_line(key.removeprefix(CHANNEL_KEY_PREFIX), message) for key, message in _channels(found)]

    async def speaker_counts(self, speaker: str) -> dict[str, int]:
        """How many lines of `speaker` each channel's memory holds, by channel key."""
        counts = await self.store.speaker_message_counts(speaker)
        return {key.removeprefix(CHANNEL_KEY_PREFIX): n for key, n in _channels(counts.items())}

    async def forget_speaker(self, speaker: str, channel: str | None = None) -> int:
        """Delete every line of `speaker` (in every channel, or in one) with
        its index entries and embedding, leaving no copy in the store's files."""
        channels = [channel] if channel is not None else list(await self.speaker_counts(speaker))
        deleted = 0
        for each in channels:
            memory_id = await self._memory_id(each)
            if memory_id is not None:
                deleted += await self.store.delete_speaker_messages(speaker, agent_id=memory_id)
        if deleted:
            await self.store.flush_deleted()
        return deleted

    async def forget_lines(self, lines: Sequence[ChannelLine]) -> int:
        """Delete these lines (found with `speaker_lines`, matched to a topic), leaving no copy."""
        by_channel: dict[str, list[str]] = {}
        for line in lines:
            by_channel.setdefault(line.channel, []).append(line.message_id)
        deleted = 0
        for channel, message_ids in by_channel.items():
            deleted += await self._delete_lines(channel, message_ids, flush=False)
        if deleted:
            await self.store.flush_deleted()
        return deleted

    async def _delete_lines(self, channel: str, message_ids: Sequence[str], *, flush: bool = True) -> int:
        memory_id = await self._memory_id(channel, trust_a_miss=False)
        if memory_id is None:
            return 0
        deleted = await self.store.delete_event_messages(memory_id, message_ids)
        if deleted and flush:
            await self.store.flush_deleted()
        return deleted

    async def prune(self, older_than: timedelta, now: datetime | None = None) -> int:
        """Retention: delete every channel's lines said more than `older_than` ago."""
        deleted = await self.store.prune_messages(CHANNEL_KEY_PREFIX, (now or utc_now()) - older_than)
        if deleted:
            await self.store.flush_deleted()
        return deleted

    async def set_consent(self, speaker: str, keep: bool | None) -> None:
        """Record whether channels may keep what `speaker` says (None: back to the default)."""
        await self.store.set_channel_consent(speaker, keep, utc_now())

    async def consent(self, speakers: Collection[str]) -> dict[str, bool]:
        """The recorded choice of each of `speakers` that made one."""
        return await self.store.channel_consent(speakers)


def _channels(pairs: Iterable[tuple[str, T]]) -> list[tuple[str, T]]:
    """Only the pairs keyed by a channel memory (a speaker's words kept elsewhere are not channel lines)."""
    return [(key, value) for key, value in pairs if key.startswith(CHANNEL_KEY_PREFIX)]
