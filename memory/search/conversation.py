"""Conversation search ranking: one agent's messages, held in memory, ranked
for a query by meaning, keywords, context, speaker and time.

Both stores (SQLite and MongoDB) keep a ConversationIndex per agent, fed with
the agent's messages in seq order and their embeddings, and call `rank`: the
ranking is this module's alone, so the backends cannot drift apart.

The score of a message is a weighted sum of six signals, each in [0, 1]
except cosines:

- meaning: cosine of the query and message embeddings (0 without a vector);
- keywords: BM25 coverage of the query's terms (memory/search/analysis.py:
  stemmed content words and whole identifiers) = the message's BM25 score
  divided by that of a message holding every term once, so the scale means the
  same for every query (as memory.search.hybrid explains for archival search);
- context: the same coverage for the message together with its neighbours, up
  to WINDOW messages either side in the same stretch of conversation (no pause
  longer than SEGMENT_GAP). An answer is often a reply ("yes, in June") whose
  topic words are in the question before it;
- next meaning: the cosine of the message after it (what a turn is about is
  often clearest in the reply);
- speaker: the query names exactly one of the people whose messages are in
  the index ("What did Caroline research?") and the message is theirs ("Name:"
  at the start of it, after any "[time]" stamp; a channel line's speaker is
  put there: Message.said_text);
- time: the query names a time ("in May 2023", "last week", memory/search/
  when.py) and the message was said in it (or up to TIME_SLACK after).

The weights were fitted on the LoCoMo dev split (bench/locomo_tune.py:
coordinate ascent on recall@10, meaning fixed at 1) and checked by training on
three conversations and testing on the fourth. A candidate is a message with a
vector or with any keyword, context or time signal; ties go to the lower seq,
so pages cut from one ranking never overlap.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt

from memory.places import Visibility
from memory.search import when
from memory.search.analysis import query_terms, terms
from memory.search.hybrid import tokens
from memory.types import Message


@dataclass(frozen=True, slots=True)
class Weights:
    meaning: float = 1.0
    keywords: float = 0.4
    context: float = 1.2
    next_meaning: float = 0.3
    speaker: float = 0.4
    time: float = 0.8


WEIGHTS = Weights()
WINDOW = 3
SEGMENT_GAP = timedelta(hours=1).total_seconds()
TIME_SLACK = timedelta(days=1).total_seconds()
# A query's terms beyond this many are ignored (identifiers come first).
MAX_TERMS = 32
# FTS5's bm25() constants, as everywhere else in the project.
K1, B = 1.2, 0.75

# "Name: ...", "[2024-05-01 10:00] alice: ...", "[...] alice in #general: ...".
_SPEAKER = re.compile(r"^(?:\[[^\]\n]{1,40}\]\s*)?(?P<name>[^\W\d_][\w.' -]{0,40}?)(?:\s+in\s+[^:\n]{1,80})?:\s")

F32 = np.float32
# An embedding: a list of floats or a numpy row.
Vector = Sequence[float] | npt.NDArray[np.floating[Any]]


def speaker_of(text: str) -> str | None:
    """Who said a message, from its "Name:" prefix (folded words), if it has one."""
    found = _SPEAKER.match(text)
    if found is None:
        return None
    name = " ".join(tokens(found.group("name")))
    return name if name and len(name.split()) <= 3 else None


def conversational(message: Message) -> bool:
    """A turn of the conversation (a person's or the agent's words), as opposed
    to tool results and system alerts: only turns are each other's context."""
    return message.role in ("user", "assistant") and message.name != "system_alert"


def embeddable(message: Message) -> bool:
    """A turn that gets an embedding (memory/recall.py embeds content, not calls)."""
    return conversational(message) and bool(message.content)


@dataclass(frozen=True, slots=True)
class Ranked:
    """Candidates as (seq, score), best first, and how many there are."""

    items: list[tuple[int, float]]
    total: int


class ConversationIndex:
    """One agent's messages as the ranking needs them. Messages are added in
    seq order (appends only: a store drops an agent's index when one of its
    messages is deleted or edited, and reads it again)."""

    def __init__(self) -> None:
        self._seqs: list[int] = []
        self._position: dict[int, int] = {}
        self._times: list[float] = []
        self._lengths: list[int] = []
        self._turn: list[bool] = []
        self._embeddable: list[bool] = []
        self._speakers: list[str | None] = []
        self._places: list[str] = []
        self._postings: dict[str, tuple[list[int], list[int]]] = {}
        self._vectors = np.zeros((0, 0), dtype=F32)
        self._has_vector = np.zeros(0, dtype=bool)
        self._derived: _Derived | None = None

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def last_seq(self) -> int:
        return self._seqs[-1] if self._seqs else 0

    @property
    def dim(self) -> int | None:
        return self._vectors.shape[1] if self._vectors.shape[1] else None

    def add(self, messages: Iterable[Message], vectors: Mapping[int, Vector] | None = None) -> None:
        """Messages newer than every one held (older or repeated seqs are skipped)."""
        for message in messages:
            if message.seq <= self.last_seq:
                continue
            position = len(self._seqs)
            text = message.searchable_text()
            found = terms(text)
            counts: dict[str, int] = {}
            for term in found:
                counts[term] = counts.get(term, 0) + 1
            for term, count in counts.items():
                positions, frequencies = self._postings.setdefault(term, ([], []))
                positions.append(position)
                frequencies.append(count)
            self._seqs.append(message.seq)
            self._position[message.seq] = position
            self._times.append(message.created_at.timestamp())
            self._lengths.append(len(found))
            self._turn.append(conversational(message) and bool(text))
            self._embeddable.append(embeddable(message))
            self._speakers.append(speaker_of(message.said_text()))
            self._places.append(message.place)
        self._derived = None
        if self.dim is not None:
            self._grow(self.dim)
        if vectors:
            self.set_vectors(vectors)

    def set_vectors(self, vectors: Mapping[int, Vector]) -> None:
        known = [(self._position[seq], vector) for seq, vector in vectors.items() if seq in self._position]
        if not known:
            return
        dim = len(known[0][1])
        if self._vectors.shape[1] not in (0, dim):
            raise ValueError(f"embedding of length {dim}, the index holds {self._vectors.shape[1]}")
        self._grow(dim)
        for position, vector in known:
            self._vectors[position] = np.asarray(vector, dtype=F32)
            self._has_vector[position] = True

    def _grow(self, dim: int) -> None:
        size = len(self._seqs)
        if self._vectors.shape[0] >= size and self._vectors.shape[1] == dim:
            return
        capacity = max(64, size, 2 * self._vectors.shape[0])
        vectors = np.zeros((capacity, dim), dtype=F32)
        has = np.zeros(capacity, dtype=bool)
        held = min(self._vectors.shape[0], capacity)
        if self._vectors.shape[1] == dim:
            vectors[:held] = self._vectors[:held]
        has[: len(self._has_vector)] = self._has_vector
        self._vectors, self._has_vector = vectors, has

    def _mask(self) -> npt.NDArray[np.bool_]:
        """Which messages have a vector, by position."""
        size = len(self._seqs)
        if self.dim is None:
            return np.zeros(size, dtype=bool)
        return self._has_vector[:size]

    def missing_vectors(self, limit: int) -> list[int]:
        """Seqs of turns without a vector, newest first (for a refresh from the store)."""
        missing = np.flatnonzero(~self._mask() & np.asarray(self._embeddable, dtype=bool))[::-1][:limit]
        return [self._seqs[position] for position in missing]

    @property
    def derived(self) -> _Derived:
        if self._derived is None:
            self._derived = _Derived(self._times, self._lengths, self._turn)
        return self._derived

    # -- ranking -----------------------------------------------------------
    def features(
        self,
        query: str,
        query_vector: Vector | None,
        now: datetime | None = None,
        seen: npt.NDArray[np.bool_] | None = None,
    ) -> dict[str, npt.NDArray[np.float32]]:
        """Every signal for every message, by position (for `rank` and for
        tuning). With `seen` (which positions a reader may see), the signals
        that borrow from neighbouring turns (context, next_meaning) borrow
        only from seen ones: an unseen message's words never lift a seen one."""
        size = len(self._seqs)
        derived = self.derived
        timed = when.parse(query, now or datetime.now(UTC))
        wanted = query_terms(timed.text)[:MAX_TERMS]
        keywords, context = self._coverage(wanted, derived, seen)
        meaning = np.zeros(size, dtype=F32)
        if query_vector is not None and self.dim is not None:
            vector = np.asarray(query_vector, dtype=F32)
            if len(vector) != self.dim:
                raise ValueError(f"query embedding of length {len(vector)}, the index holds {self.dim}")
            # einsum, not @: a matrix-vector product through OpenBLAS spreads
            # over threads that fight the embedder and the event loop for the
            # cores (22 ms for 10,000 x 384 on a busy 2-core machine, 1.6 here).
            cosines = np.einsum("ij,j->i", self._vectors[:size], vector)
            meaning = np.where(self._mask(), cosines, F32(0)).astype(F32)
        lent = meaning if seen is None else np.where(seen, meaning, F32(0))
        next_meaning = np.where(derived.next >= 0, lent[np.maximum(derived.next, 0)], F32(0)).astype(F32)
        return {
            "meaning": meaning,
            "keywords": keywords,
            "context": context,
            "next_meaning": next_meaning,
            "speaker": self._speaker_signal(query),
            "time": self._time_signal(timed.window, derived),
        }

    def rank(
        self,
        query: str,
        query_vector: Vector | None,
        limit: int,
        offset: int = 0,
        *,
        now: datetime | None = None,
        weights: Weights = WEIGHTS,
        visible: Visibility | None = None,
    ) -> Ranked:
        """One page of candidates, best first, and the number of candidates;
        with `visible`, only messages it sees are candidates (filtered before
        paging, so the total counts visible ones only)."""
        size = len(self._seqs)
        if not size:
            return Ranked([], 0)
        seen = None
        if visible is not None and not visible.everything:
            seen = np.fromiter(map(visible.sees, self._places), dtype=bool, count=size)
        signals = self.features(query, query_vector, now, seen)
        score = sum(getattr(weights, name) * value for name, value in signals.items())
        if query_vector is None:
            # Keywords alone (no embedding to be had): the messages holding a
            # query term, ranked by every signal; a neighbour's words only lift.
            candidate = signals["keywords"] > 0
        else:
            candidate = self._mask() | (signals["keywords"] > 0) | (signals["context"] > 0) | (signals["time"] > 0)
        if seen is not None:
            candidate &= seen
        positions = np.flatnonzero(candidate)
        total = len(positions)
        want = max(offset, 0) + max(limit, 0)
        if not total or limit <= 0 or offset >= total:
            return Ranked([], total)
        scores = np.asarray(score, dtype=np.float64)[positions]
        if want < total:
            # Everything tied with the last wanted score stays in, so the
            # order below (score, then seq) is the full ranking's.
            cut = np.partition(scores, total - want)[total - want]
            keep = scores >= cut
            positions, scores = positions[keep], scores[keep]
        seqs = np.asarray(self._seqs, dtype=np.int64)[positions]
        order = np.lexsort((seqs, -scores))[offset:want]
        return Ranked([(int(seqs[n]), float(scores[n])) for n in order], total)

    def _coverage(
        self, wanted: list[str], derived: _Derived, seen: npt.NDArray[np.bool_] | None = None
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """BM25 coverage of `wanted` by each message alone and by its window
        (of the `seen` messages only, if given)."""
        size = len(self._seqs)
        own = np.zeros(size, dtype=np.float64)
        window = np.zeros(size, dtype=np.float64)
        documents = max(derived.documents, 1)
        idf_total = 0.0
        for term in wanted:
            positions, frequencies = self._postings.get(term, ([], []))
            idf = max(1e-6, math.log((documents - len(positions) + 0.5) / (len(positions) + 0.5)))
            idf_total += idf
            if not positions:
                continue
            at = np.asarray(positions, dtype=np.int64)
            tf = np.asarray(frequencies, dtype=np.float64)
            own[at] += idf * tf * (K1 + 1) / (tf + derived.norm[at])
            # The same term in each turn's window: prefix sums over the turns.
            dense = np.zeros(size, dtype=np.float64)
            dense[at] = tf
            if seen is not None:
                dense[~seen] = 0.0
            summed = derived.window_sum(dense)
            window += idf * summed * (K1 + 1) / (summed + derived.window_norm)
        if idf_total <= 0:
            return np.zeros(size, dtype=F32), np.zeros(size, dtype=F32)
        own = np.clip(own / idf_total, 0.0, 1.0)
        # Tool results and alerts are nobody's reply: they have no context.
        window = np.where(derived.turn, np.clip(window / idf_total, 0.0, 1.0), 0.0)
        return own.astype(F32), window.astype(F32)

    def _speaker_signal(self, query: str) -> npt.NDArray[np.float32]:
        speakers = self.derived.speakers(self._speakers)
        padded = f" {' '.join(tokens(query))} "
        named = [code for name, code in speakers.codes.items() if f" {name} " in padded]
        if len(named) != 1:
            return np.zeros(len(self._seqs), dtype=F32)
        return np.asarray(speakers.by_position == named[0], dtype=F32)

    def _time_signal(self, window: when.TimeWindow | None, derived: _Derived) -> npt.NDArray[np.float32]:
        size = len(self._seqs)
        if window is None or not size:
            return np.zeros(size, dtype=F32)
        times = derived.times
        spans = [(window.start, window.end)]
        if window.any_year:
            first = datetime.fromtimestamp(float(times.min()), UTC).year - 1
            last = datetime.fromtimestamp(float(times.max()), UTC).year
            spans = [
                (window.start + shift, window.end + shift)
                for year in range(first, last + 1)
                if (shift := when.year_shift(window.start, year)) is not None
            ]
        inside = np.zeros(size, dtype=bool)
        for start, end in spans:
            inside |= (times >= start.timestamp()) & (times < end.timestamp() + TIME_SLACK)
        return inside.astype(F32)


@dataclass(frozen=True, slots=True)
class _Speakers:
    """Each speaker's name and number, and each message's speaker number (-1: none)."""

    codes: dict[str, int]
    by_position: npt.NDArray[np.int64]


class _Derived:
    """Arrays computed from the messages once per change: lengths and their
    BM25 normalisation, each turn's next turn and its window of neighbours."""

    def __init__(self, times: list[float], lengths: list[int], turn: list[bool]) -> None:
        size = len(times)
        self.times = np.asarray(times, dtype=np.float64)
        length = np.asarray(lengths, dtype=np.float64)
        self.turn = np.asarray(turn, dtype=bool)
        self.documents = int(np.count_nonzero(length))
        average = float(length.sum()) / max(self.documents, 1) or 1.0
        self.norm = K1 * (1 - B + B * length / average)

        # Turns in order; a pause longer than SEGMENT_GAP starts a new stretch.
        turns = np.flatnonzero(self.turn)
        self._turns = turns
        gaps = np.abs(np.diff(self.times[turns])) > SEGMENT_GAP if len(turns) else np.zeros(0, dtype=bool)
        segment = np.concatenate([[0], np.cumsum(gaps)]) if len(turns) else np.zeros(0, dtype=np.int64)
        index = np.arange(len(turns))
        first = np.searchsorted(segment, segment, side="left")
        last = np.searchsorted(segment, segment, side="right") - 1
        self._low = np.maximum(index - WINDOW, first)
        self._high = np.minimum(index + WINDOW, last)
        self.next = np.full(size, -1, dtype=np.int64)
        has_next = index < last
        self.next[turns[has_next]] = turns[index[has_next] + 1]

        window_length = self.window_sum(length)
        average_window = float(window_length[turns].mean()) if len(turns) else 1.0
        self.window_norm = K1 * (1 - B + B * window_length / (average_window or 1.0))
        self._speakers: _Speakers | None = None

    def speakers(self, names: list[str | None]) -> _Speakers:
        if self._speakers is None:
            codes: dict[str, int] = {}
            by_position = np.fromiter(
                (-1 if name is None else codes.setdefault(name, len(codes)) for name in names),
                dtype=np.int64,
                count=len(names),
            )
            self._speakers = _Speakers(codes, by_position)
        return self._speakers

    def window_sum(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """For each turn, the sum of `values` over its window (other messages: 0)."""
        out = np.zeros(len(values), dtype=np.float64)
        if len(self._turns):
            prefix = np.concatenate([[0.0], np.cumsum(values[self._turns])])
            out[self._turns] = prefix[self._high + 1] - prefix[self._low]
        return out
