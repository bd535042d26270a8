"""Words as conversation and archival search index them: folded, stop words out, stemmed,
plus each identifier written without spaces as one term of its own.

Stemming ("researching" finds "research", "painted" finds "paint") is the
largest single gain of the keyword part on LoCoMo (memory/search/
conversation.py has the figures). Identifiers are kept whole and unstemmed:
"QX-4471-ZP" is indexed as its words and as the term "qx 4471 zp", which a
look-alike such as "QX-4471-ZQ" does not hold, so the exact one ranks first.
"""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer

from memory.search.hybrid import STOPWORDS, tokens

# Archival search ORs every query term in FTS5 (and MongoDB fetches the
# passages holding each), so a long query keeps only its first terms:
# identifiers come first.
MAX_KEYWORD_TERMS = 24

_STEMMER = Stemmer.Stemmer("english")
# Contractions are not identifiers: "I'm" is not the term "i m".
_APOSTROPHES = re.compile(r"^[^\W_]+['’][^\W_]{1,2}[^\w]*$")


@lru_cache(maxsize=100_000)
def stem(word: str) -> str:
    return str(_STEMMER.stemWord(word))


def terms(text: str) -> list[str]:
    """The terms of `text`, in order, repeated as often as they occur."""
    found: list[str] = []
    for chunk in text.split():
        words = tokens(chunk)
        # Numbers are left as they are (no stemmer changes one): not through
        # the cache, which a long document's many numbers would only fill.
        found.extend(word if word.isdecimal() else stem(word) for word in words if word not in STOPWORDS)
        if len(words) > 1 and not _APOSTROPHES.match(chunk):
            found.append(" ".join(words))
    return found


def query_terms(text: str) -> list[str]:
    """The distinct terms of a query, identifiers first."""
    found = terms(text)
    return list(dict.fromkeys(sorted(found, key=lambda term: " " not in term)))


def keyword_terms(text: str) -> list[str]:
    """The terms archival search looks up for a query (both backends)."""
    return query_terms(text)[:MAX_KEYWORD_TERMS]
