"""The keyword half of MongoStore's hybrid archival search: BM25 as SQLite's
FTS5 computes it, over the analysed terms stored on each passage.

Each passage document carries `terms` (its distinct analysed terms, memory/
search/analysis.py: folded, stop words out, stemmed, identifiers also whole,
what memory/sqlite/terms.py indexes in FTS5), `words` (how many terms it has,
the document length BM25 needs) and `analysed` (the version of the analysis,
ANALYSIS_VERSION). The (agent_id, terms) index finds an agent's passages
holding a query term; everything else (term frequencies, BM25, coverage) runs
in Python on the few candidates, so the score is the one memory/sqlite/
search.py gets from bm25() and both backends rank alike. `$text` is not used:
its stemming is not this one and its score has no IDF.

Statistics are per agent (SQLite's are over the whole table): the index is per
agent, so counting another agent's passages would cost a scan, and coverage
divides by the same IDFs it sums, so the scale cancels out either way.
Passages stored in an older shape (unstemmed words) are re-analysed at open
(upgrade_passage_terms).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from memory.mongo.base import update_by_id
from memory.search.analysis import keyword_terms, terms
from memory.search.hybrid import coverage, idf

log = logging.getLogger(__name__)

# Stored terms are cut to this length (a base64 blob must not make an index key
# too long); lookups cut the same way, term frequencies use the full terms.
MAX_TERM = 64
# The analysis the stored terms come from: 2 is memory/search/analysis.py
# (stemmed, identifiers whole); passages without it hold unstemmed words.
ANALYSIS_VERSION = 2
# Passages read at a time when an old database is upgraded.
UPGRADE_BATCH = 500
# Like sqlite_search: a word held by more passages than this is left out of
# the keyword query (fetching its passages costs time, its IDF is tiny), and
# at most this many keyword hits, the best by BM25, get a bonus.
MAX_ROWS_PER_WORD = 5_000
CANDIDATE_POOL = 100
# FTS5's bm25() constants.
_K1, _B = 1.2, 0.75
_WORD = re.compile(r"\w+")


def passage_terms(text: str) -> dict[str, Any]:
    """The keyword fields stored on a passage document."""
    found = terms(text)
    return {"terms": sorted({term[:MAX_TERM] for term in found}), "words": len(found), "analysed": ANALYSIS_VERSION}


async def _word_counts(passages: AsyncCollection[Any], agent_id: str, words: Sequence[str]) -> dict[str, int]:
    """Passages of the agent holding each term, counted up to just past the cap (index-only counts)."""
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
    wanted = keyword_terms(text)
    keys = list(dict.fromkeys(term[:MAX_TERM] for term in wanted))
    if not keys:
        return {}
    counts = await _word_counts(passages, agent_id, keys)
    # As sqlite_search drops a term held by too many rows (its IDF is tiny).
    rare = [term for term in wanted if counts[term[:MAX_TERM]] <= MAX_ROWS_PER_WORD]
    held_keys = list(dict.fromkeys(term[:MAX_TERM] for term in rare if counts[term[:MAX_TERM]]))
    if not held_keys:
        return {}
    total_rows, avg_len = await _statistics(passages, agent_id)
    cursor = passages.find({"agent_id": agent_id, "terms": {"$in": held_keys}, **(where or {})}, {"text": 1})
    docs = {doc["_id"]: Counter(terms(doc["text"])) async for doc in cursor}
    lengths = {pid: sum(found.values()) for pid, found in docs.items()}
    if avg_len <= 0:
        avg_len = max(sum(lengths.values()) / max(len(docs), 1), 1.0)
    total_rows = max(total_rows, len(docs), 1)

    scores: defaultdict[int, float] = defaultdict(float)
    idf_total = 0.0
    for term in rare:
        held = {pid: f for pid, found in docs.items() if (f := found[term])}
        # IDF from the agent's passages holding the term, visible or not, as
        # SQLite counts its FTS rows. A term no passage holds still counts in
        # the whole: a query about things never mentioned earns a small bonus.
        weight = idf(max(total_rows, counts[term[:MAX_TERM]]), counts[term[:MAX_TERM]])
        idf_total += weight
        for pid, f in held.items():
            norm = _K1 * (1.0 - _B + _B * lengths[pid] / avg_len)
            scores[pid] += weight * f * (_K1 + 1.0) / (f + norm)
    best = sorted(scores.items(), key=lambda hit: (-hit[1], hit[0]))[:CANDIDATE_POOL]
    return coverage(dict(best), idf_total)


async def upgrade_passage_terms(passages: AsyncCollection[Any]) -> None:
    """Re-analyse the passages stored with older keyword fields (idempotent,
    at open; logs how many). Read UPGRADE_BATCH at a time, written by _id."""
    old = {"analysed": {"$ne": ANALYSIS_VERSION}}
    upgraded = 0
    while batch := [doc async for doc in passages.find(old, {"text": 1}).limit(UPGRADE_BATCH)]:
        await update_by_id(passages, [(doc["_id"], passage_terms(doc["text"])) for doc in batch])
        upgraded += len(batch)
    if upgraded:
        log.info("re-analysed the keyword terms of %d archival passages (stemmed, identifiers whole)", upgraded)


# -- messages: recall search's keywords, BM25 over their words ------------------
def words(text: str) -> list[str]:
    """Searchable words: \\w runs, case-folded, accents removed (café = CAFE)."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    folded = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return [word[:MAX_TERM] for word in _WORD.findall(folded)]


def bm25(docs: Sequence[Sequence[str]], query: Sequence[str], n_docs: int, avg_len: float) -> list[float]:
    """Okapi BM25 of each document (a word list) for `query`, given every
    document that contains any query word and the collection's size and mean
    length. IDF is the always-positive form ln(1 + (N - df + .5) / (df + .5))."""
    counts = [Counter(doc) for doc in docs]
    n = max(n_docs, len(docs))
    avg = avg_len if avg_len > 0 else max(sum(map(len, docs)) / max(len(docs), 1), 1.0)
    idf = {}
    for term in query:
        df = sum(1 for count in counts if term in count)
        idf[term] = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
    scores = []
    for doc, count in zip(docs, counts, strict=True):
        norm = _K1 * (1.0 - _B + _B * len(doc) / avg)
        scores.append(sum(idf[t] * count[t] * (_K1 + 1.0) / (count[t] + norm) for t in query if t in count))
    return scores
