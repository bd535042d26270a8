"""What a topic matches in one person's memory.

The candidates come from the searches the agent itself uses, best first:
recall's conversation search (meaning, stemmed keywords, context, the next
turn, speaker, time: memory/search/conversation.py) and archival search (the
hybrid of meaning and keywords). A ranking orders everything, so a cut is
needed: an item matches when it holds one of the topic's terms (stemmed, stop
words out: memory/search/analysis.py) or its embedding is within
MEANING_MATCH of the topic's ("my diagnosis" finds "I was diagnosed with
hypothyroidism"). Pages are read until one holds no match.

A function call and its result are one item of the conversation: when either
matches, both go (a result without its call, or the reverse, is a request no
LLM server accepts), with every result of the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import numpy as np

from memory.embeddings import Embedder
from memory.search.analysis import query_terms, terms
from memory.types import OPERATOR_KEY, Block, ChannelLine, ConversationRecord, Message, Passage
from memory.working_context import is_placeholder

# Cosine of all-MiniLM-L6-v2 embeddings above which an item is about the topic.
MEANING_MATCH = 0.5
# Stems at least this long match when one starts the other.
PREFIX_MIN = 6
# Items read per page of a ranking, and pages at most (a topic in more than
# PAGE * MAX_PAGES items is forgotten in more than one go).
PAGE = 100
MAX_PAGES = 20
_SENTENCE_END = (".", "!", "?")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a working-context block, with where and when it was written."""

    id: str
    label: str
    text: str
    place: str
    written_at: datetime
    shared: bool = False  # shown everywhere (the person shared it)


@dataclass(frozen=True, slots=True)
class ChannelNote:
    """A line of a channel's notes (the `channel` block of its memory) credited to a person."""

    channel: str  # channel key
    agent_id: str  # the channel memory's
    line: Line


@dataclass(slots=True)
class Found:
    """What a topic matched, by kind: the person's own memory, then what
    channel memories hold of them (their lines, the notes credited to them)."""

    about: str
    messages: list[Message] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    summaries: list[ConversationRecord] = field(default_factory=list)
    channel_lines: list[ChannelLine] = field(default_factory=list)
    channel_notes: list[ChannelNote] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        own = self.messages or self.passages or self.lines or self.summaries
        return not (own or self.channel_lines or self.channel_notes)

    def counts(self) -> dict[str, int]:
        return {
            "messages": len(self.messages),
            "passages": len(self.passages),
            "notes": len(self.lines),
            "summaries": len(self.summaries),
            "channel_lines": len(self.channel_lines),
            "channel_notes": len(self.channel_notes),
        }


def block_lines(block: Block) -> list[Line]:
    """A block's lines as ledger items, each with its place and time; the
    operator's text (the default persona, a placeholder) is nobody's memory."""
    return [
        Line(line.id, block.label, line.text, line.place, line.written_at, line.shared)
        for line in block.lines
        if line.text.strip() and line.place != OPERATOR_KEY and not is_placeholder(block, line)
    ]


def sentences(text: str) -> list[str]:
    """A summary's sentences (the unit a summary loses when the rewrite fails)."""
    found: list[str] = []
    current: list[str] = []
    for word in text.split():
        current.append(word)
        if word.endswith(_SENTENCE_END):
            found.append(" ".join(current))
            current = []
    if current:
        found.append(" ".join(current))
    return found


class Matcher:
    """Whether texts are about a topic: one of its terms, or close in meaning."""

    def __init__(self, about: str, embedder: Embedder) -> None:
        self.about = about
        self.terms = set(query_terms(about))
        self.embedder = embedder
        self._vector: np.ndarray | None = None

    async def matches(self, texts: Sequence[str]) -> list[bool]:
        if not texts:
            return []
        if self._vector is None:
            self._vector = await self.embedder.embed_one(self.about)
        vectors = await self.embedder.embed(list(texts))
        cosines = vectors @ self._vector
        return [self.names(text) or float(cosine) >= MEANING_MATCH for text, cosine in zip(texts, cosines, strict=True)]

    def names(self, text: str) -> bool:
        """Whether `text` holds one of the topic's terms: the same stem, or, for
        long words, one stem the start of the other (the stemmer leaves
        "diagnosis" as "diagnosi" and "diagnosed" as "diagnos")."""
        for term in terms(text):
            if term in self.terms:
                return True
            if len(term) >= PREFIX_MIN and any(
                len(wanted) >= PREFIX_MIN and (term.startswith(wanted) or wanted.startswith(term))
                for wanted in self.terms
            ):
                return True
        return False

    async def mentioned_in(self, text: str) -> list[str]:
        """The sentences of `text` about the topic."""
        parts = sentences(text)
        return [part for part, hit in zip(parts, await self.matches(parts), strict=True) if hit]


# The agent's searches, unfiltered by place (a topic is forgotten everywhere):
# (query, limit, offset) -> one page, best first.
Search = Callable[[str, int, int], Awaitable[Sequence[T]]]


async def find(
    recall_search: Search[Message],
    archival_search: Search[Passage],
    matcher: Matcher,
    history: Sequence[Message],
    blocks: Sequence[Block],
    conversations: Sequence[ConversationRecord],
) -> Found:
    """Everything of one agent about `matcher.about` (`history`: every message
    it holds, to pair calls with their results)."""
    found = Found(matcher.about)
    matched = await ranked_matches(recall_search, matcher, lambda message: message.searchable_text())
    found.messages = with_their_pairs(matched, history)
    passages = await ranked_matches(archival_search, matcher, lambda passage: passage.text)
    # Shared collections are not the person's: only their own archival storage.
    found.passages = [passage for passage in passages if getattr(passage, "collection", None) is None]
    lines = [line for block in blocks for line in block_lines(block)]
    hits = await matcher.matches([line.text for line in lines])
    found.lines = [line for line, hit in zip(lines, hits, strict=True) if hit]
    for conversation in conversations:
        if conversation.summary and await matcher.mentioned_in(conversation.summary):
            found.summaries.append(conversation)
    return found


async def ranked_matches(search: Search[T], matcher: Matcher, text_of: Callable[[T], str]) -> list[T]:
    """The matching items of a ranking, best first, page by page until a page holds none."""
    kept: list[T] = []
    for page in range(MAX_PAGES):
        items = await search(matcher.about, PAGE, page * PAGE)
        hits = await matcher.matches([text_of(item) for item in items])
        kept.extend(item for item, hit in zip(items, hits, strict=True) if hit)
        if len(items) < PAGE or not any(hits):
            break
    return kept


def with_their_pairs(matched: Sequence[Message], history: Sequence[Message]) -> list[Message]:
    """`matched` plus the other half of each function call among them: a
    call's results, a result's call (and that call's other results)."""
    calls = {
        call.get("id"): message
        for message in history
        if message.role == "assistant"
        for call in message.tool_calls or []
    }
    results: dict[str | None, list[Message]] = {}
    for message in history:
        if message.role == "tool":
            results.setdefault(message.tool_call_id, []).append(message)
    chosen = {message.seq: message for message in matched}
    for message in matched:
        call = calls.get(message.tool_call_id) if message.role == "tool" else message
        if call is None or not call.tool_calls:
            continue
        chosen[call.seq] = call
        for each in call.tool_calls:
            for result in results.get(each.get("id"), []):
                chosen[result.seq] = result
    return sorted(chosen.values(), key=lambda message: message.seq)
