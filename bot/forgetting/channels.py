"""What channel memories hold of a person, and their say over it (a mixin of
Runtime, for the slash commands and the CLI):

- `/memory` lists, per channel, how many of their messages its memory keeps
  and how many of its notes are credited to them (`channel_items`); each is an
  item forgotten on its own ("channel:<channel key>").
- `/memory channels off` records their choice first, then deletes what was
  kept of them (`channel_setting`); `on` records it back; alone, it shows the
  setting and the counts.
- `/forget` and `/forget about:` reach their lines and the notes credited to
  them (`find_in_channels`, `erase_in_channels`), and every copy of those in
  other people's memories (bot/forgetting/copies.py).

The race with a line being kept while they opt out: the choice is written
before anything is deleted, so a keep that checks consent after the write
keeps nothing, and one that checked before and appends after the deletion is
caught by its own check after appending (ChannelMemory.keep_with_consent).

Channel work runs outside the person's door: listening does not go through
their agent, and a copy in someone else's memory is removed through that
person's door (never one door held inside another's).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.forgetting.copies import remove_copies
from bot.forgetting.ledger import Item
from bot.forgetting.matching import ChannelNote, Line, Matcher
from bot.reports import plural
from memory.channels import ChannelMemory, memory_key
from memory.places import Place
from memory.types import CHANNEL_KEY_PREFIX, ChannelLine
from memory.working_context import forget_lines

if TYPE_CHECKING:
    from bot.channels.listening import ChannelListener
    from bot.door import Doors
    from bot.services import AgentServices
    from memory.store import Store

CHANNELS_OFF = (
    "Done: channels no longer keep what you say, and I deleted what they kept of you: {gone}. "
    "Turn it back on with /memory channels on."
)
CHANNELS_ON = "Done: channels where I listen may keep what you say again. Turn it off with /memory channels off."
CHANNELS_HOW = (
    "Turn it off (and delete what channels kept of you) with /memory channels off; back on with /memory channels on."
)


@dataclass(frozen=True, slots=True)
class ChannelErased:
    lines: int = 0
    notes: int = 0
    copies: int = 0  # messages in other people's memories that quoted them


def channel_id(channel: str) -> str:
    """The platform's id of a channel key ("slack:T01:C02" -> "C02")."""
    return channel.rsplit(":", 1)[-1]


class ChannelCommands:
    store: Store
    doors: Doors
    channel_memory: ChannelMemory
    services: AgentServices
    channels: ChannelListener

    # -- reading --------------------------------------------------------------
    async def credited_notes(self, key: str, channel: str | None = None) -> list[ChannelNote]:
        """The channel notes credited to `key`, in every channel's memory (or one)."""
        notes: list[ChannelNote] = []
        for agent in await self.store.list_agents():
            if not agent.key.startswith(CHANNEL_KEY_PREFIX):
                continue
            each = agent.key.removeprefix(CHANNEL_KEY_PREFIX)
            if channel is not None and each != channel:
                continue
            for block in await self.store.load_blocks(agent.id):
                notes.extend(
                    ChannelNote(each, agent.id, Line(line.id, block.label, line.text, line.place, line.written_at))
                    for line in block.lines
                    if line.speaker == key
                )
        return notes

    async def channel_names(self, key: str, channels: Sequence[str]) -> dict[str, str]:
        """The name people know each channel by ("#general"), where the store knows one."""
        names: dict[str, str] = {}
        records = [await self.store.find_agent(key), *[await self.store.find_agent(memory_key(c)) for c in channels]]
        for record in records:
            if record is None:
                continue
            for conversation in await self.store.list_conversations(record.id):
                place = Place.from_key(conversation.place, conversation.name)
                if place.name:
                    names.setdefault(place.id, place.name)
        return {channel: names.get(channel_id(channel), "") for channel in channels}

    async def channel_items(self, key: str) -> list[Item]:
        """One ledger item per channel whose memory holds something of `key`."""
        counts = await self.channel_memory.speaker_counts(key)
        notes: dict[str, int] = defaultdict(int)
        for note in await self.credited_notes(key):
            notes[note.channel] += 1
        channels = sorted(set(counts) | set(notes))
        names = await self.channel_names(key, channels)
        items = []
        for channel in channels:
            held = [f"{plural(counts.get(channel, 0), 'message')} of yours"]
            if notes.get(channel):
                held.append(f"{plural(notes[channel], 'note')} credited to you")
            text = " and ".join(held)
            items.append(Item(f"channel:{channel}", "channel", text, "", None, place_name=names[channel] or channel))
        return items

    async def find_in_channels(self, key: str, matcher: Matcher) -> tuple[list[ChannelLine], list[ChannelNote]]:
        """Their channel lines and the notes credited to them that are about the matcher's topic."""
        lines = await self.channel_memory.speaker_lines(key)
        hits = await matcher.matches([line.text for line in lines])
        notes = await self.credited_notes(key)
        note_hits = await matcher.matches([note.line.text for note in notes])
        return (
            [line for line, hit in zip(lines, hits, strict=True) if hit],
            [note for note, hit in zip(notes, note_hits, strict=True) if hit],
        )

    # -- deleting -------------------------------------------------------------
    def forget_in_channels_after(self, key: str, about: str) -> None:
        """Forget `about` in their channel lines and credited notes once the turn asking for it
        ends (the chat's forget_memories: its agent's door is held, and this passes others')."""

        async def forgetting() -> None:
            lines, notes = await self.find_in_channels(key, Matcher(about, self.services.archival.embedder))
            if lines or notes:
                await self.erase_in_channels(key, lines, notes)

        self.doors.after(forgetting)

    async def erase_in_channels(
        self,
        key: str,
        lines: Sequence[ChannelLine] | None = None,
        notes: Sequence[ChannelNote] | None = None,
        *,
        channel: str | None = None,
    ) -> ChannelErased:
        """Delete `lines` and `notes` (None: all of theirs, in every channel or
        in `channel`), then every copy of them in other people's memories, and
        the words of their finished events in the inbox and outbox."""
        memory = self.channel_memory
        if lines is None:
            listed = await memory.speaker_lines(key, channel)
            # By speaker, not by the list: a line kept since the listing goes too.
            deleted = await memory.forget_speaker(key, channel)
        else:
            listed, deleted = list(lines), await memory.forget_lines(lines)
        if notes is None:
            notes = await self.credited_notes(key, channel)
        dropped = await self._drop_notes(notes)
        texts = [line.text for line in listed] + [note.line.text for note in notes]
        channels = {channel_id(line.channel) for line in listed} | {channel_id(note.channel) for note in notes}
        copies = await remove_copies(self.store, self.doors, texts, owner=key, channels=channels)
        await self.store.inbox_scrub(key)  # a listened message's payload is theirs (bot/durable/inbox.py)
        await self.store.flush_deleted()
        return ChannelErased(deleted, dropped, copies)

    async def _drop_notes(self, notes: Sequence[ChannelNote]) -> int:
        by_block: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        for note in notes:
            by_block[(note.channel, note.agent_id, note.line.label)].add(note.line.id)
        for (channel, agent_id, label), ids in by_block.items():

            async def dropping(agent_id: str = agent_id, label: str = label, ids: set[str] = ids) -> None:
                await forget_lines(self.store, agent_id, label, ids)

            # The channel's door: a note written there meanwhile is not lost, nor this one restored.
            await self.doors.admin(memory_key(channel), dropping)
            if self.services.channel_notes is not None:
                self.services.channel_notes.forget(channel)  # this process's copy, read again at once
        return len(notes)

    # -- /memory channels -----------------------------------------------------------
    async def channel_setting(self, key: str, choice: str = "") -> str:
        """`/memory channels [on|off]`: record the choice (off: then delete), or show it; the answer."""
        choice = choice.strip().lower()
        if choice == "off":
            # The choice first: from now on no keep adds a line of theirs (see the docstring).
            await self.channel_memory.set_consent(key, False)
            self.channels.consent_changed(key)
            erased = await self.erase_in_channels(key)
            gone = f"{plural(erased.lines, 'message')} and {plural(erased.notes, 'note')} credited to you"
            return CHANNELS_OFF.format(gone=gone)
        if choice == "on":
            await self.channel_memory.set_consent(key, True)
            self.channels.consent_changed(key)  # this process keeps their next line at once
            return CHANNELS_ON
        if choice:
            return f"/memory channels takes on or off, not {choice!r}."
        consent = (await self.channel_memory.consent([key])).get(key, True)
        setting = "on: channels where I listen keep what you say" if consent else "off: channels keep nothing of you"
        items = await self.channel_items(key)
        held = [f"- {item.place_name}: {item.text}" for item in items] or ["Channels hold nothing of you."]
        return "\n".join([f"Channel memory is {setting}.", *held, CHANNELS_HOW])
