"""Working context: labelled blocks of limited size that the model edits itself.

Every line of a block records the place it was written from (memory/types.py
BlockLine), and a place is shown only the lines it may read (memory/places.py
Visibility): a DM every line; a private channel its own lines and public
ones; a public channel only what was written in public places. A fact the
model writes into `human` while answering a DM is a DM fact until the person
shares it (`everywhere`, `share_line`): which block the model picks keeps no
secret, the store does. The `private` block is shown, and editable, only in
DMs. The operator's text (the default persona, placeholders) is shown
everywhere.

Edits touch only the lines the current place can see, never truncate, and
never take a block over its limit, which counts every line, seen here or
not: an edit that would overflow is refused with an error telling the model
what to do (condense the block, or move facts to archival storage). Outside
DMs the error and the character counts the model reads speak only of what
that place can see, so they hint at nothing kept for other places.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace as with_fields
from datetime import datetime

from memory.places import DM, DM_KEY, Place, Visibility
from memory.roles import BlockStore
from memory.types import OPERATOR_KEY, Block, BlockLine, join_lines, new_line_id, text_lines, utc_now

DEFAULT_PERSONA = (
    "I am a friendly, attentive companion in this community's chat. I remember people, "
    "follow up on what they told me, keep answers short and warm, and never invent memories."
)
DEFAULT_HUMAN = "Nothing known yet about this person."
DEFAULT_PRIVATE = ""
PRIVATE_BLOCK = "private"
DEFAULT_PRIVATE_LIMIT = 1_000
# What a block shows while nothing in it may be read here; an append replaces it.
PLACEHOLDERS = {"human": DEFAULT_HUMAN}
PRIVATE_ELSEWHERE = (
    "The private block can be edited only in a direct message with the person, where it is shown; "
    "here others may read along. Keep this for their next DM, or save what is not private in human."
)


PRIVATE_UNSHARED = (
    "The private block is shown only in DMs and cannot be shared everywhere. If the person wants this known "
    "everywhere, save it in human with everywhere=true."
)


class MemoryEditError(ValueError):
    """An edit the model asked for that cannot be done; the text goes back to it."""


def default_blocks(
    persona_limit: int,
    human_limit: int,
    persona: str = DEFAULT_PERSONA,
    *,
    private_limit: int = DEFAULT_PRIVATE_LIMIT,
) -> list[Block]:
    return [
        Block(label="persona", value=persona[:persona_limit], limit=persona_limit, place=OPERATOR_KEY),
        Block(label="human", value=DEFAULT_HUMAN[:human_limit], limit=human_limit, place=OPERATOR_KEY),
        Block(label=PRIVATE_BLOCK, value=DEFAULT_PRIVATE[:private_limit], limit=private_limit, place=OPERATOR_KEY),
    ]


def sees(visible: Visibility, line: BlockLine) -> bool:
    """Whether a place with `visible` may read `line`."""
    return line.shared or line.place == OPERATOR_KEY or visible.sees(line.place)


def is_placeholder(block: Block, line: BlockLine) -> bool:
    return line.text == PLACEHOLDERS.get(block.label)


class WorkingContext:
    def __init__(self, blocks: Iterable[Block]) -> None:
        self.blocks: dict[str, Block] = {block.label: block for block in blocks}

    def get(self, name: str) -> Block:
        block = self.blocks.get(name)
        if block is None:
            known = ", ".join(repr(label) for label in self.blocks)
            raise MemoryEditError(f"No memory block named {name!r}. Blocks are: {known}.")
        return block

    def _shareable(self, name: str, place: Place, everywhere: bool) -> Block:
        if name == PRIVATE_BLOCK and not place.is_dm:
            raise MemoryEditError(PRIVATE_ELSEWHERE)
        if name == PRIVATE_BLOCK and everywhere:
            raise MemoryEditError(PRIVATE_UNSHARED)
        return self.get(name)

    # -- what a place reads --------------------------------------------------
    def shown(self, name: str, place: Place) -> str:
        """The text of block `name` as `place` reads it."""
        block = self.get(name)
        visible = Visibility.of(place)
        seen = [line for line in block.lines if sees(visible, line)]
        if not seen or all(is_placeholder(block, line) for line in seen):
            return PLACEHOLDERS.get(block.label, "")
        return join_lines(line for line in seen if not is_placeholder(block, line))

    def usage(self, name: str, place: Place) -> str:
        """ "used/limit" characters of block `name` as `place` reads it."""
        block = self.get(name)
        return f"{len(self.shown(name, place))}/{block.limit}"

    def render(self, place: Place = DM) -> str:
        """The blocks as the model reads them in `place` (the private block only in a DM)."""
        parts = []
        for label in self.blocks:
            if label == PRIVATE_BLOCK and not place.is_dm:
                continue
            parts.append(f'<{label} chars="{self.usage(label, place)}">\n{self.shown(label, place)}\n</{label}>')
        return "\n".join(parts)

    # -- edits (each returns the edited block; `commit` adopts it once stored) --
    def append(self, name: str, content: str, place: Place, *, everywhere: bool = False) -> Block:
        """`content` as new lines written from `place`; shown in every place if
        `everywhere` (the person asked for it to be known)."""
        block = self._shareable(name, place, everywhere)
        added = [with_fields(line, shared=everywhere) for line in text_lines(content.strip(), place.key)]
        if not added:
            raise MemoryEditError("Nothing to append: content is empty.")
        # The placeholder goes once something real is written.
        kept = [line for line in block.lines if not is_placeholder(block, line)]
        return self._set(block, kept + added, place)

    def replace(
        self, name: str, old_content: str, new_content: str, place: Place, *, everywhere: bool = False
    ) -> Block:
        """Replace `old_content` in the lines `place` can see; the rewritten
        lines are written from `place` (what is new was said here). With
        `everywhere` the lines it touches are shown in every place: replacing
        a line's text with itself shares it."""
        block = self._shareable(name, place, everywhere)
        if not old_content:
            raise MemoryEditError("old_content is empty; give the exact text to replace.")
        visible = Visibility.of(place)
        seen = [index for index, line in enumerate(block.lines) if sees(visible, line)]
        text = join_lines(block.lines[index] for index in seen)
        groups = _touched(text, old_content, [len(block.lines[index].text) for index in seen])
        if not groups and not text:
            raise MemoryEditError(
                f"Block {name!r} holds nothing that may be read here; add to it with core_memory_append."
            )
        if not groups:
            raise MemoryEditError(
                f"old_content not found in block {name!r} as shown here. Copy the exact text from the block "
                "(it is case- and whitespace-sensitive)."
            )
        now = utc_now()
        rewritten: dict[int, list[BlockLine]] = {}  # first touched line -> the lines that take the group's place
        dropped: set[int] = set()
        for first, last, segment in groups:
            old_lines = [block.lines[seen[k]] for k in range(first, last + 1)]
            new_texts = [line for line in segment.replace(old_content, new_content).split("\n") if line.strip()]
            lines = []
            for n, new_text in enumerate(new_texts):
                old = old_lines[n] if n < len(old_lines) else None
                if old is not None and old.text == new_text:
                    lines.append(with_fields(old, shared=True) if everywhere else old)
                else:
                    line_id = old.id if old is not None else new_line_id()
                    lines.append(BlockLine(new_text, place.key, now, line_id, shared=everywhere))
            rewritten[seen[first]] = lines
            dropped.update(seen[k] for k in range(first, last + 1))
        result: list[BlockLine] = []
        for index, line in enumerate(block.lines):
            result.extend(rewritten.get(index, []))
            if index not in dropped:
                result.append(line)
        return self._set(block, result, place)

    def share_line(self, name: str, line_id: str) -> Block:
        """Show line `line_id` of block `name` everywhere (the person's own way, from /memory)."""
        block = self.get(name)
        if name == PRIVATE_BLOCK:
            raise MemoryEditError("Lines of the private block are shown only in your DMs; they cannot be shared.")
        if not any(line.id == line_id for line in block.lines):
            raise MemoryEditError(f"No line {line_id!r} in block {name!r}.")
        return self._shared(block, line_id)

    def without(self, name: str, line_ids: Iterable[str]) -> Block:
        """Block `name` with the lines `line_ids` removed (the person forgetting them)."""
        block = self.get(name)
        gone = set(line_ids)
        return Block(block.label, limit=block.limit, lines=[line for line in block.lines if line.id not in gone])

    def _shared(self, block: Block, line_id: str) -> Block:
        lines = [with_fields(line, shared=True) if line.id == line_id else line for line in block.lines]
        return Block(block.label, limit=block.limit, lines=lines)

    def _set(self, block: Block, lines: list[BlockLine], place: Place) -> Block:
        size = len(join_lines(lines))
        if size > block.limit:
            if place.is_dm:
                room = block.limit - len(block.value)
                detail = f"would hold {size} characters, over its limit of {block.limit} ({room} characters free now)"
            else:
                # Nothing about lines kept for other places: only that it does not fit.
                detail = f"has no room for this edit (its limit is {block.limit} characters)"
            raise MemoryEditError(
                f"Edit refused: block {block.label!r} {detail}. Condense it with core_memory_replace, "
                "or save details with archival_memory_insert."
            )
        return Block(block.label, limit=block.limit, lines=lines)

    def commit(self, block: Block) -> None:
        """Adopt an edited block once it is safely stored."""
        self.blocks[block.label] = block


def _touched(text: str, old: str, lengths: Sequence[int]) -> list[tuple[int, int, str]]:
    """Where `old` occurs in `text` (lines of `lengths` joined by newlines): the
    runs of lines the occurrences touch, as (first line, last line, their text);
    overlapping runs merged."""
    starts, at = [], 0
    for length in lengths:
        starts.append(at)
        at += length + 1
    ends = [start + length for start, length in zip(starts, lengths, strict=True)]
    runs: list[list[int]] = []
    found = text.find(old)
    while found != -1:
        end = found + len(old)
        first = next(k for k, line_end in enumerate(ends) if line_end >= found)
        last = next(k for k, line_end in enumerate(ends) if line_end >= end)
        if runs and first <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], last)
        else:
            runs.append([first, last])
        found = text.find(old, end)
    return [(first, last, text[starts[first] : ends[last]]) for first, last in runs]


async def share_line(store: BlockStore, agent_id: str, label: str, line_id: str) -> Block:
    """Make one line of an agent's block visible everywhere, as stored (for
    `/memory`: the caller holds the agent's lane and refreshes a loaded agent)."""
    context = WorkingContext(await store.load_blocks(agent_id))
    block = context.share_line(label, line_id)
    await store.save_block(agent_id, block)
    return block


async def forget_lines(store: BlockStore, agent_id: str, label: str, line_ids: Iterable[str]) -> Block:
    """Remove lines of an agent's block, as stored (same contract as share_line)."""
    context = WorkingContext(await store.load_blocks(agent_id))
    block = context.without(label, line_ids)
    await store.save_block(agent_id, block)
    return block


def lines_from_before_places(value: str, written_at: datetime) -> list[BlockLine]:
    """The lines of a block's text stored before lines had places (both
    backends' upgrades): written in the DM, the safe side, unless it is the
    operator's own default text (the default persona, a placeholder)."""
    defaults = (DEFAULT_PERSONA, *PLACEHOLDERS.values())
    operator = bool(value) and any(default.startswith(value) for default in defaults)
    return text_lines(value, OPERATOR_KEY if operator else DM_KEY, written_at)
