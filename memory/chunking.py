"""Split document text into token-bounded passages for archival storage.

Paragraphs stay whole where they fit; a passage carries the nearest heading
as its position so search results can say where they came from. Consecutive
passages overlap by one paragraph (or a token tail) so an answer that
straddles a boundary is still found in one piece.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memory.tokens import TokenCounter

HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")


@dataclass(slots=True)
class Chunk:
    text: str
    position: str


def _paragraphs(text: str) -> list[tuple[str, str]]:
    """(paragraph, heading it sits under), in order."""
    heading = ""
    result: list[tuple[str, str]] = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        block = block.strip()
        if not block:
            continue
        first_line = block.split("\n", 1)[0]
        match = HEADING.match(first_line)
        if match:
            heading = match.group(2)
        result.append((block, heading))
    return result


def _split_long(paragraph: str, counter: TokenCounter, max_tokens: int) -> list[str]:
    """A paragraph over the limit is cut at sentence, then word, boundaries."""
    pieces: list[str] = []
    current = ""
    for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
        candidate = f"{current} {sentence}".strip()
        if counter.count(candidate) <= max_tokens:
            current = candidate
            continue
        if current:
            pieces.append(current)
        while counter.count(sentence) > max_tokens:
            head = counter.truncate(sentence, max_tokens)
            cut = head.rfind(" ")
            head = head[:cut] if cut > len(head) // 2 else head
            pieces.append(head.strip())
            sentence = sentence[len(head) :].strip()
        current = sentence
    if current:
        pieces.append(current)
    return pieces


def chunk_text(text: str, counter: TokenCounter, max_tokens: int = 256, overlap_tokens: int = 32) -> list[Chunk]:
    chunks: list[Chunk] = []
    current: list[str] = []
    current_tokens = 0
    position = ""
    for paragraph, heading in _paragraphs(text):
        if current and heading != position:
            # A new section starts a new passage, so results name the right heading.
            chunks.append(Chunk("\n\n".join(current), position))
            current, current_tokens = [], 0
        for piece in _split_long(paragraph, counter, max_tokens):
            tokens = counter.count(piece)
            if current and current_tokens + tokens > max_tokens:
                chunks.append(Chunk("\n\n".join(current), position))
                tail = current[-1]
                # Overlap: carry the last paragraph over when it is short enough.
                current, current_tokens = (
                    ([tail], counter.count(tail)) if counter.count(tail) <= overlap_tokens else ([], 0)
                )
            if not current:
                position = heading
            current.append(piece)
            current_tokens += tokens
    if current:
        chunks.append(Chunk("\n\n".join(current), position))
    return chunks
