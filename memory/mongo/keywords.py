"""The keyword half of MongoStore's hybrid archival search: BM25 as SQLite's
FTS5 computes it, over the folded words stored on each passage.

Each passage document carries `terms` (its distinct folded tokens, what FTS5's
unicode61 tokenizer with remove_diacritics would index) and `words` (its
token count, the document length BM25 needs). The (agent_id, terms) index
finds an agent's passages holding a query word; everything else (phrase
matching, BM25, coverage) runs in Python on the few candidates, so the score is
the one memory/sqlite/search.py gets from bm25() and both backends rank alike.
`$text` is not used: it stems and its score has no IDF.

Statistics are per agent (SQLite's are over the whole table): the index is per
agent, so counting another agent's passages would cost a scan, and coverage
divides by the same IDFs it sums, so the scale cancels out either way.
Passages stored before `terms` existed have no keyword side; they are still
ranked by their vector.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from memory.search.hybrid import coverage, idf, keyword_query, tokens

# Stored terms are cut to this length (a base64 blob must not make an index key
# too long); lookups cut the same way, phrase checks use the full tokens.
MAX_TERM = 64
# Like sqlite_search: a word held by more passages than this is left out of
# the keyword query (fetching its passages costs time, its IDF is tiny), and
# at most this many keyword hits, the best by BM25, get a bonus.
MAX_ROWS_PER_WORD = 5_000
CANDIDATE_POOL = 100
# FTS5's bm25() constants.
_K1, _B = 1.2, 0.75


def passage_terms(text: str) -> dict[str, Any]:
    """The keyword fields stored on a passage document."""
    found = tokens(text)
    return {"terms": sorted({word[:MAX_TERM] for word in found}), "words": len(found)}


def _occurrences(doc_tokens: Sequence[str], phrase: Sequence[str]) -> int:
    """How often `phrase` (a token sequence) occurs in `doc_tokens`, as FTS5 counts a phrase."""
    width = len(phrase)
    if width == 1:
        return sum(1 for token in doc_tokens if token == phrase[0])
    first = phrase[0]
    return sum(
        1
        for n in range(len(doc_tokens) - width + 1)
        if doc_tokens[n] == first and list(doc_tokens[n : n + width]) == list(phrase)
    )


async def _word_counts(passages: AsyncCollection[Any], agent_id: str, words: Sequence[str]) -> dict[str, int]:
    """Passages of the agent holding each word, counted up to just past the cap (index-only counts)."""
    counts = await asyncio.gather(
        *(
            passages.count_documents({"agent_id": agent_id, "terms": word}, limit=MAX_ROWS_PER_WORD + 1)
            for word in words
        )
    )
    return dict(zip(words, counts, strict=True))


async def _statistics(passages: AsyncCollection[Any], agent_id: str) -> tuple[int, float]:
    """(passages of the agent, their mean length in tokens) for IDF and length normalisation.
    The mean is over passages that store `words`; older ones are left out of it."""

    async def mean_length() -> float:
        # $sum and a count, not $avg: FerretDB has no $avg accumulator.
        cursor = await passages.aggregate(
            [
                {"$match": {"agent_id": agent_id, "words": {"$exists": True}}},
                {"$group": {"_id": None, "n": {"$sum": 1}, "words": {"$sum": "$words"}}},
            ]
        )
        async for row in cursor:
            return float(row["words"]) / max(int(row["n"]), 1)
        return 0.0

    total, mean = await asyncio.gather(passages.count_documents({"agent_id": agent_id}), mean_length())
    return int(total), mean


async def keyword_scores(
    passages: AsyncCollection[Any], agent_id: str, text: str, where: dict[str, Any] | None = None
) -> dict[int, float]:
    """Coverage (0-1, see memory.search.hybrid) of `text`'s keyword expressions for
    the agent's best keyword matches (at most CANDIDATE_POOL), by passage id.
    `where` (a place filter) limits the candidates before they are ranked, so
    the pool holds the best matches among those passages only."""
    query = keyword_query(text)
    if query is None:
        return {}
    # Expressions are quoted token runs; their words are what the index holds.
    phrases = [tuple(expression.strip('"').split()) for expression in query.expressions]
    words = list(dict.fromkeys(word[:MAX_TERM] for phrase in phrases for word in phrase))
    counts = await _word_counts(passages, agent_id, words)
    rare = [word for word in words if counts[word] <= MAX_ROWS_PER_WORD]
    if not any(counts[word] for word in rare):
        return {}
    total_rows, avg_len = await _statistics(passages, agent_id)
    # Every passage holding a kept expression holds one of its rare words, so
    # these candidates give exact per-expression row counts.
    held_words = [w for w in rare if counts[w]]
    cursor = passages.find({"agent_id": agent_id, "terms": {"$in": held_words}, **(where or {})}, {"text": 1})
    docs = {doc["_id"]: tokens(doc["text"]) async for doc in cursor}
    if avg_len <= 0:
        avg_len = max(sum(map(len, docs.values())) / max(len(docs), 1), 1.0)
    total_rows = max(total_rows, len(docs), 1)

    scores: defaultdict[int, float] = defaultdict(float)
    idf_total = 0.0
    for phrase in phrases:
        # As sqlite_search drops an expression held by too many rows; a phrase
        # made only of such words is dropped too (its own count is unknown).
        if not any(word[:MAX_TERM] in rare for word in phrase):
            continue
        held = {pid: f for pid, doc_tokens in docs.items() if (f := _occurrences(doc_tokens, phrase))}
        # An expression no passage holds still counts in the whole: a query
        # about things the archive never mentions earns a small bonus.
        weight = idf(total_rows, len(held))
        idf_total += weight
        for pid, f in held.items():
            norm = _K1 * (1.0 - _B + _B * len(docs[pid]) / avg_len)
            scores[pid] += weight * f * (_K1 + 1.0) / (f + norm)
    best = sorted(scores.items(), key=lambda hit: (-hit[1], hit[0]))[:CANDIDATE_POOL]
    return coverage(dict(best), idf_total)
