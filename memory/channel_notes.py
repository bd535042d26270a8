"""Channel notes: a working-context block of a channel, shared by everyone's
agent that answers there, each line credited to whose message it came from.

Storage. The block `channel` of the channel memory's pseudo-agent
(memory/channels.py: the agent keyed `channel:` + channel key), kept with the
BlockStore role like any agent's block. Each line's `speaker` is the agent key
of the person whose message the agent was answering when it wrote the line
(forgetting that person removes it) and `speaker_name` their display name then.

Shown as "name: text", one line each, so the model reads who said what. The
model edits what it reads: an edit is made on that shown text with the one
implementation of block edits (memory/working_context.py), then mapped back
to stored lines: a line left as it was keeps its credit, a new or rewritten
line is credited to the person now answered (a copied "name: " in front is
dropped, not doubled). The limit counts the shown text.

Cheap to read. One ChannelNotes serves a process: every agent there reads the
same cached copy, which an edit made in the process replaces at once; a copy
is read again from the store after NOTES_SECONDS (what another process wrote
is seen within that time). A channel without a memory record costs the
cached lookup of ChannelMemory.memory_id. Edits of one channel take turns in
the process, each on the stored block read afresh; two processes editing the
same channel's notes within one store round trip can lose one edit (the
block is written whole: BlockStore has no compare-and-set).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace as with_fields

from cachetools import LRUCache

from memory.channels import ChannelMemory
from memory.places import Place
from memory.types import OPERATOR_KEY, Block, BlockLine
from memory.working_context import WorkingContext

NOTES_BLOCK = "channel"
DEFAULT_NOTES_LIMIT = 1_000
NOTES_SECONDS = 10.0  # how long a cached copy is trusted before the store is read again
NOTES_CACHED = 4_096  # channels whose notes one process keeps in memory
EMPTY = "(no notes yet)"
UNNAMED = "someone"

Edit = Callable[[WorkingContext], Block]  # one block edit, on the notes as the model reads them


def shown_line(line: BlockLine) -> str:
    return f"{line.speaker_name or UNNAMED}: {line.text}"


def notes_size(block: Block | None) -> int:
    """Characters of the notes as shown: what the limit counts."""
    return len(_shown_text(block))


def _shown_text(block: Block | None) -> str:
    return "\n".join(shown_line(line) for line in block.lines) if block is not None else ""


def render_notes(block: Block | None, limit: int) -> str:
    """The channel block as a prompt shows it (an empty one says so)."""
    body = _shown_text(block)
    return f'<{NOTES_BLOCK} chars="{len(body)}/{limit}">\n{body or EMPTY}\n</{NOTES_BLOCK}>'


def edit_notes(block: Block, edit: Edit, place: Place, speaker: str, name: str) -> Block:
    """`edit` made on the notes as shown; the lines it adds or rewrites are
    credited to `speaker` (`name`) and written from `place`."""
    stored = {line.id: line for line in block.lines}
    shown = Block(
        NOTES_BLOCK,
        limit=block.limit,
        lines=[with_fields(line, text=shown_line(line), place=OPERATOR_KEY) for line in block.lines],
    )
    edited = edit(WorkingContext([shown]))
    credits = [f"{line.speaker_name or UNNAMED}: " for line in block.lines] + [f"{name}: "]
    lines = []
    for line in edited.lines:
        old = stored.get(line.id)
        if old is not None and shown_line(old) == line.text:
            lines.append(old)
            continue
        text = line.text
        for credit in credits:
            text = text.removeprefix(credit)
        if text.strip():
            lines.append(BlockLine(text, place.key, line.written_at, line.id, speaker=speaker, speaker_name=name))
    return Block(NOTES_BLOCK, limit=block.limit, lines=lines)


class ChannelNotes:
    """Every channel's notes, for the agents of one process."""

    def __init__(self, memory: ChannelMemory, limit: int = DEFAULT_NOTES_LIMIT) -> None:
        self.memory = memory
        self.limit = limit
        # channel key -> (its block, or None: no notes; time.monotonic() when read)
        self._copies: LRUCache[str, tuple[Block | None, float]] = LRUCache(NOTES_CACHED)
        self._locks: dict[str, asyncio.Lock] = {}

    async def read(self, channel: str) -> Block | None:
        """The channel's notes: the cached copy while fresh, else as stored."""
        copy = self._copies.get(channel)
        if copy is not None and time.monotonic() - copy[1] < NOTES_SECONDS:
            return copy[0]
        return await self._load(channel)

    def forget(self, channel: str) -> None:
        """Notes of the channel were deleted: read them from the store next time."""
        self._copies.pop(channel, None)

    async def _load(self, channel: str) -> Block | None:
        memory_id = await self.memory.memory_id(channel)
        block = None
        if memory_id is not None:
            block = next((b for b in await self.memory.store.load_blocks(memory_id) if b.label == NOTES_BLOCK), None)
        self._copies[channel] = (block, time.monotonic())
        return block

    async def edit(self, channel: str, edit: Edit, place: Place, speaker: str, name: str) -> Block:
        """Make `edit` on the stored notes (see edit_notes) and keep them; the
        edited block. MemoryEditError (for the model) if it cannot be made."""
        lock = self._locks.setdefault(channel, asyncio.Lock())
        async with lock:
            current = await self._load(channel) or Block(NOTES_BLOCK, limit=self.limit)
            current.limit = self.limit  # the deployment's setting, as for every block
            block = edit_notes(current, edit, place, speaker, name)
            memory_id = await self.memory.memory_id(channel, create=True)
            assert memory_id is not None
            await self.memory.store.save_block(memory_id, block)
            self._copies[channel] = (block, time.monotonic())
        if not lock.locked():
            self._locks.pop(channel, None)
        return block
