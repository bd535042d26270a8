"""Working context: labelled blocks of limited size that the model edits itself.

The `private` block holds what the person said in confidence: it is shown,
and editable, only in their direct messages (memory/places.py); channels see
the other blocks only.

Edits never truncate and never exceed a block's limit: an edit that would
overflow is refused with an error that tells the model how much room is left,
so it can condense the block (core_memory_replace) or move facts to archival
storage instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from memory.types import Block, utc_now

DEFAULT_PERSONA = (
    "I am a friendly, attentive companion in this community's chat. I remember people, "
    "follow up on what they told me, keep answers short and warm, and never invent memories."
)
DEFAULT_HUMAN = "Nothing known yet about this person."
DEFAULT_PRIVATE = ""
PRIVATE_BLOCK = "private"
DEFAULT_PRIVATE_LIMIT = 1_000
# Placeholders an append replaces instead of extending.
PLACEHOLDERS = (DEFAULT_HUMAN,)


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
        Block(label="persona", value=persona[:persona_limit], limit=persona_limit),
        Block(label="human", value=DEFAULT_HUMAN[:human_limit], limit=human_limit),
        Block(label=PRIVATE_BLOCK, value=DEFAULT_PRIVATE[:private_limit], limit=private_limit),
    ]


class WorkingContext:
    def __init__(self, blocks: Iterable[Block]) -> None:
        self.blocks: dict[str, Block] = {block.label: block for block in blocks}

    def get(self, name: str) -> Block:
        block = self.blocks.get(name)
        if block is None:
            known = ", ".join(repr(label) for label in self.blocks)
            raise MemoryEditError(f"No memory block named {name!r}. Blocks are: {known}.")
        return block

    def append(self, name: str, content: str) -> Block:
        block = self.get(name)
        content = content.strip()
        if not content:
            raise MemoryEditError("Nothing to append: content is empty.")
        # A block that still holds only its placeholder is replaced, not extended.
        base = "" if block.value in PLACEHOLDERS else block.value
        new_value = f"{base}\n{content}" if base else content
        return self._set(block, new_value)

    def replace(self, name: str, old_content: str, new_content: str) -> Block:
        block = self.get(name)
        if not old_content:
            raise MemoryEditError("old_content is empty; give the exact text to replace.")
        count = block.value.count(old_content)
        if count == 0:
            raise MemoryEditError(
                f"old_content not found in block {name!r}. Copy the exact text from the block "
                "(it is case- and whitespace-sensitive)."
            )
        new_value = block.value.replace(old_content, new_content)
        new_value = "\n".join(line for line in new_value.split("\n") if line.strip()) if not new_content else new_value
        return self._set(block, new_value)

    def _set(self, block: Block, new_value: str) -> Block:
        if len(new_value) > block.limit:
            room = block.limit - len(block.value)
            raise MemoryEditError(
                f"Edit refused: block {block.label!r} would hold {len(new_value)} characters, over "
                f"its limit of {block.limit} ({room} characters free now). Condense it with "
                "core_memory_replace, or save details with archival_memory_insert."
            )
        updated = Block(label=block.label, value=new_value, limit=block.limit, updated_at=utc_now())
        return updated

    def commit(self, block: Block) -> None:
        """Adopt an edited block once it is safely stored."""
        self.blocks[block.label] = block

    def render(self, *, private: bool = True) -> str:
        """The blocks as the model reads them; without the private block unless `private` (a DM)."""
        parts = []
        for block in self.blocks.values():
            if block.label == PRIVATE_BLOCK and not private:
                continue
            parts.append(f'<{block.label} chars="{len(block.value)}/{block.limit}">\n{block.value}\n</{block.label}>')
        return "\n".join(parts)
