"""Hybrid ranking: keyword (BM25) and meaning (embedding cosine) in one score.

Why a calibrated sum and not reciprocal rank fusion: RRF looks only at ranks,
so on an archive of look-alike passages ("The value of key <uuid> is <uuid>.")
the one passage holding the asked-for UUID gets 1/(k+1) from BM25, while
whatever the embedding happens to rank first gets about as much from the other
side, and every passage matching the common words ("value", "key") adds a
second small term: the exact hit drowns. Rank fusion also yields scores that
mean nothing outside one result list, while archival search merges lists from
several stores (an agent's own passages and its attached collections) by score.

So the score here is

    relevance = cosine(query, passage) + KEYWORD_WEIGHT * coverage

where `coverage` in [0, 1] is the passage's BM25 score divided by the BM25
score of a passage holding every query term once (the sum of their
IDFs). A passage that holds the rare strings of the query (an id, a code, a
name) gets close to the full bonus; one that shares only common words gets
almost none, because those words have almost no IDF. With no keyword match at
all the relevance is the plain cosine, so pure meaning search is unchanged and
a paraphrase with no shared word is ranked by the embedding alone.

The keyword side works on analysed terms (memory/search/analysis.py, as
conversation search does): folded, stop words out, Snowball-stemmed, and each
token run written without spaces ("3f2a-4e5d", "A-113", "v2.1") also kept
whole as one term, so "researching" finds "research" and the whole id
outweighs a look-alike that shares some of its parts. Both backends index
those terms (SQLite: an FTS5 table of them, memory/sqlite/terms.py; MongoDB:
each passage's `terms`, memory/mongo/keywords.py) and compute the same BM25.
(Word pairs as phrases were tried and dropped: a pair that is adjacent in the
question is rarely adjacent in the passage, "code X" vs "code is X", and an
term no passage holds only dilutes the bonus.)
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping

# Bonus for a passage that holds every query term. MiniLM cosines of
# related passages differ by a few hundredths among look-alikes and by about
# 0.2-0.5 between a relevant and an unrelated one: the full bonus must beat
# the first, and a partial bonus from one shared common-ish word must not beat
# the second.
KEYWORD_WEIGHT = 0.6

# Letters and digits only: what FTS5's unicode61 tokenizer keeps as tokens
# ("_" and every other punctuation mark separate tokens there too).
_TOKEN = re.compile(r"[^\W_]+")

# Common English function words: in a small archive they still carry some IDF
# and would let a passage that shares only "where" and "does" outrank the one
# that answers the question.
STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most
    my myself no nor not now of off on once only or other our ours ourselves out over own same she should
    so some such than that the their theirs them themselves then there these they this those through to
    too under until up very was we were what when where which while who whom why will with would you your
    yours yourself yourselves s t d ll m re ve please tell know find search remember anything something
    """.split()
)


def fold(text: str) -> str:
    """Text as FTS5 unicode61 with remove_diacritics sees it: no accents, no case."""
    if text.isascii():  # most text: nothing to decompose, and ASCII's casefold is its lower case
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(fold(text))


def idf(total_rows: int, rows_with: int) -> float:
    """The IDF that FTS5's bm25() gives a term, so that `coverage`
    divides bm25 by a number on its own scale."""
    return max(1e-6, math.log((total_rows - rows_with + 0.5) / (rows_with + 0.5)))


def coverage(bm25_scores: Mapping[int, float], idf_total: float) -> dict[int, float]:
    """bm25 (as a positive number, higher is better) as a share of the score of
    a passage of average length holding every term once. Above 1 only
    for short passages or repeated words; clipped, so no passage gets more
    than the full bonus."""
    if idf_total <= 0:
        return {}
    return {item: min(1.0, max(0.0, score / idf_total)) for item, score in bm25_scores.items()}


def fuse(
    vector: Mapping[int, float], keyword: Mapping[int, float], weight: float = KEYWORD_WEIGHT
) -> list[tuple[int, float]]:
    """Every id in `vector` scored as cosine + weight * coverage, best first;
    ties go to the lower id so pages cut from one ranking never overlap."""
    scored = [(item, cosine + weight * keyword.get(item, 0.0)) for item, cosine in vector.items()]
    scored.sort(key=lambda pair: (-pair[1], pair[0]))
    return scored
