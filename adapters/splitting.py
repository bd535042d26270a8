"""Split a long reply into chunks a platform accepts (Discord: 2,000 chars).

Breaks fall on the best boundary available within the limit: a paragraph,
then a line, then a sentence, then a word; a hard cut only when a single word
is longer than the limit. A break inside a ``` code block closes the block at
the end of the chunk and reopens it (with its language tag) in the next one,
so every chunk renders as the writer meant.
"""

from __future__ import annotations

import re

FENCE = "```"
_SENTENCE_END = re.compile(r"[.!?…][)\"'»”]*\s")


def _open_fence_at(text: str, position: int) -> str | None:
    """The opening fence line (e.g. "```python") if `position` is inside a code block."""
    opener: str | None = None
    for line_match in re.finditer(r"^[ \t]*```[^\n]*$", text[:position], flags=re.MULTILINE):
        line = line_match.group(0).strip()
        opener = None if opener is not None else line
    return opener


def _best_break(text: str, limit: int) -> int:
    """Index to cut `text` at, 0 < index <= limit, preferring natural boundaries.
    The returned index is just after the separator, so nothing is dropped."""
    window = text[:limit]
    floor = limit // 3  # never make a tiny chunk just to honour a boundary
    for separator in ("\n\n", "\n"):
        index = window.rfind(separator)
        if index >= floor:
            return index + len(separator)
    ends = [match.end() for match in _SENTENCE_END.finditer(window)]
    if ends and ends[-1] >= floor:
        return ends[-1]
    index = max(window.rfind(" "), window.rfind("\t"))
    if index >= floor:
        return index + 1
    return limit


def split_message(text: str, limit: int) -> list[str]:
    """Chunks of at most `limit` characters, in order, losing nothing."""
    if limit < 64:
        raise ValueError("limit must be at least 64 characters")
    chunks: list[str] = []
    rest = text
    while len(rest) > limit:
        cut = _best_break(rest, limit)
        opener = _open_fence_at(rest, cut)
        if opener is not None:
            closing = "\n" + FENCE
            # Leave room for the closing fence, then re-check which block we are in.
            cut = _best_break(rest, limit - len(closing))
            opener = _open_fence_at(rest, cut)
        head, rest = rest[:cut], rest[cut:]
        if opener is not None and len(opener) > limit // 8:
            opener = FENCE  # an outsized info string is not worth repeating
        if opener is not None:
            head = head.rstrip("\n") + "\n" + FENCE
            rest = opener + "\n" + rest.lstrip("\n")
        if head.strip():
            chunks.append(head.rstrip() if opener is None else head)
        rest = rest if opener is not None else rest.lstrip("\n")
    if rest.strip() or not chunks:
        chunks.append(rest.rstrip() if chunks else rest)
    return chunks


TRUNCATED = "\n… (cut short: there is more than fits here)"


def split_at_most(text: str, limit: int, most: int = 5) -> list[str]:
    """`split_message`, cut to `most` chunks (a wall of private answers helps nobody),
    the last saying it was cut."""
    chunks = split_message(text, limit)
    if len(chunks) <= most:
        return chunks
    kept = chunks[:most]
    # Re-split the last kept chunk so the note fits without cutting through a code fence.
    kept[-1] = split_message(kept[-1], limit - len(TRUNCATED))[0] + TRUNCATED
    return kept
