"""Split documents into token-bounded passages for archival storage.

Sizes are real token counts (memory.tokens.TokenCounter). A section (a page,
or the text under one heading) never shares a passage with another, so every
passage has exactly one position. Inside a section paragraphs stay whole
where they fit; longer ones are cut at line, then sentence, then word
boundaries. Consecutive passages of a section overlap by a short tail of
the previous one, so an answer that straddles a cut is still found in one
piece. No passage is ever over `max_tokens`.

`iter_chunks` packs a stream of sections as it comes (a long section in
parts, see memory/ingest/documents.py), holding one passage's worth of text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from memory.ingest.documents import Section, markdown_sections
from memory.tokens import CHARS_PER_TOKEN_ESTIMATE, TokenCounter

# all-MiniLM-L6-v2 reads at most 256 word pieces (and is trained on 128); 200
# tiktoken tokens of prose stay under that, so no passage is embedded truncated.
DEFAULT_MAX_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 30

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?…。])\s+")
_PARAGRAPH, _LINE, _SPACE = "\n\n", "\n", " "


@dataclass(slots=True)
class Chunk:
    text: str
    position: str
    tokens: int = 0


def chunk_text(
    text: str,
    counter: TokenCounter,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
) -> list[Chunk]:
    """Markdown (or plain) text: every `#` heading starts a new passage."""
    return chunk_sections(markdown_sections(text), counter, max_tokens, overlap_tokens)


def chunk_sections(
    sections: Iterable[Section],
    counter: TokenCounter,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
) -> list[Chunk]:
    return list(iter_chunks(sections, counter, max_tokens, overlap_tokens))


def iter_chunks(
    sections: Iterable[Section],
    counter: TokenCounter,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
) -> Iterator[Chunk]:
    """Passages of `sections` as they are packed; a section marked `continues`
    is packed on with the one before it."""
    if max_tokens < 16:
        raise ValueError(f"max_tokens must be at least 16, got {max_tokens}")
    # At most half a passage may repeat the previous one, or passages would crawl.
    overlap = max(0, min(overlap_tokens, max_tokens // 2))
    packer: _Packer | None = None
    for section in sections:
        if packer is None or not section.continues:
            if packer is not None:
                yield from packer.finish()
            packer = _Packer(counter, max_tokens, overlap, section.position)
        yield from packer.feed(section.text)
    if packer is not None:
        yield from packer.finish()


class _Packer:
    """Greedy packing of one section's pieces into passages."""

    def __init__(self, counter: TokenCounter, max_tokens: int, overlap: int, position: str) -> None:
        self.counter = counter
        self.max_tokens = max_tokens
        self.overlap = overlap
        self.position = position
        # A piece of a cut paragraph leaves room for the overlap in front of it.
        self.piece_limit = max(8, max_tokens - overlap - 1)
        self.chunks: list[Chunk] = []
        self.parts: list[tuple[str, str]] = []  # (joiner before it, text)
        self.tokens = 0

    def feed(self, text: str) -> list[Chunk]:
        """Pack more of the section; the passages completed by it."""
        for paragraph in _PARAGRAPH_BREAK.split(text.strip()):
            paragraph = paragraph.strip("\n")
            if not paragraph.strip():
                continue
            size = self.counter.count(paragraph)
            if self._fits(size):
                self._add(_PARAGRAPH, paragraph, size)
            elif size <= self.max_tokens:
                # A whole paragraph beats a full overlap: shrink the overlap to fit.
                self._emit(room_for=size)
                self._add(_PARAGRAPH, paragraph, size)
            else:
                # A piece cut from inside a paragraph joins the overlap tail
                # with a space or newline: it continues the tail's paragraph.
                joiner = _PARAGRAPH
                for piece, piece_size, next_joiner in self._pieces(paragraph):
                    if not self._fits(piece_size):
                        self._emit(room_for=piece_size)
                    self._add(joiner, piece, piece_size)
                    joiner = next_joiner
        return self._take()

    def finish(self) -> list[Chunk]:
        """The section's last passage."""
        self._emit(room_for=None)
        return self._take()

    def _take(self) -> list[Chunk]:
        chunks, self.chunks = self.chunks, []
        return chunks

    def _fits(self, size: int) -> bool:
        return self.tokens + (1 if self.parts else 0) + size <= self.max_tokens

    def _add(self, joiner: str, text: str, size: int) -> None:
        self.tokens += (1 if self.parts else 0) + size
        self.parts.append((joiner, text))

    def _emit(self, *, room_for: int | None) -> None:
        """Close the current passage; with `room_for`, open the next one with
        an overlap that leaves room for a piece of that many tokens."""
        if not self.parts:
            return
        text = self.parts[0][1] + "".join(joiner + part for joiner, part in self.parts[1:])
        self._store(text)
        self.parts, self.tokens = [], 0
        if room_for is None:
            return
        tail = self._tail(text, min(self.overlap, self.max_tokens - room_for - 1))
        if tail:
            self.parts = [("", tail)]
            self.tokens = self.counter.count(tail)

    def _store(self, text: str) -> None:
        size = self.counter.count(text)
        if size <= self.max_tokens:
            self.chunks.append(Chunk(text, self.position, size))
            return
        # Token counts of joined pieces can exceed the sum of their parts by a
        # token or two; re-cut the rare passage that does, word by word.
        for piece, piece_size in self._words(text, self.max_tokens, exact=True):
            self.chunks.append(Chunk(piece, self.position, piece_size))

    def _tail(self, text: str, budget: int) -> str:
        """The end of `text` within `budget` tokens, starting at a sentence or word."""
        if budget <= 0:
            return ""
        try:
            tokens = self.counter.encoder.encode_ordinary(text)
            if len(tokens) <= budget:
                return ""  # the whole passage again would only be a duplicate
            tail = self.counter.encoder.decode(tokens[-budget:])
        except NotImplementedError:  # the character estimate cannot decode
            tail = text[-int(budget * CHARS_PER_TOKEN_ESTIMATE) :]
        cut = re.search(r"\s", tail)
        tail = tail[cut.end() :] if cut else ""
        sentence = _SENTENCE_END.search(tail)
        if sentence and len(tail) - sentence.end() >= len(tail) // 3:
            tail = tail[sentence.end() :]
        tail = tail.strip()
        while tail and self.counter.count(tail) > budget:
            tail = tail.partition(" ")[2]
        return tail

    def _pieces(self, paragraph: str) -> Iterable[tuple[str, int, str]]:
        """(text, tokens, joiner to the next piece), each within piece_limit."""
        lines = paragraph.split("\n")
        for line_number, line in enumerate(lines):
            line_joiner = _LINE if line_number < len(lines) - 1 else _SPACE
            sentences = [s for s in _SENTENCE_END.split(line) if s.strip()] or [line]
            for sentence_number, sentence in enumerate(sentences):
                joiner = _SPACE if sentence_number < len(sentences) - 1 else line_joiner
                size = self.counter.count(sentence)
                if size <= self.piece_limit:
                    yield sentence, size, joiner
                    continue
                words = self._words(sentence, self.piece_limit, exact=False)
                for word_number, (piece, piece_size) in enumerate(words):
                    yield piece, piece_size, joiner if word_number == len(words) - 1 else _SPACE

    def _words(self, text: str, limit: int, *, exact: bool) -> list[tuple[str, int]]:
        """`text` cut at spaces into runs within `limit` tokens (a word longer
        than that is cut by tokens). With `exact`, every run is recounted."""
        runs: list[tuple[str, int]] = []
        current: list[str] = []
        size = 0
        for word in text.split():
            word_size = self.counter.count(" " + word)
            if word_size > limit:
                if current:
                    runs.append((" ".join(current), size))
                    current, size = [], 0
                runs.extend(self._token_windows(word, limit))
                continue
            if current and size + word_size > limit:
                runs.append((" ".join(current), size))
                current, size = [], 0
            current.append(word)
            size += word_size
        if current:
            runs.append((" ".join(current), size))
        if not exact:
            return runs
        checked: list[tuple[str, int]] = []
        for run, _ in runs:
            real = self.counter.count(run)
            if real <= limit:
                checked.append((run, real))
            else:
                checked.extend(self._token_windows(run, limit))
        return checked

    def _token_windows(self, word: str, limit: int) -> list[tuple[str, int]]:
        try:
            tokens = self.counter.encoder.encode_ordinary(word)
            pieces = [self.counter.encoder.decode(tokens[i : i + limit]) for i in range(0, len(tokens), limit)]
        except NotImplementedError:
            step = max(1, int(limit * CHARS_PER_TOKEN_ESTIMATE))
            pieces = [word[i : i + step] for i in range(0, len(word), step)]
        return [(piece, self.counter.count(piece)) for piece in pieces if piece.strip()]
