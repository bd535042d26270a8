"""Archival passages' analysed terms in SQLite's FTS5 table `passages_fts`.

FTS5 cannot stem or keep an identifier whole by itself, so the table is fed
the analysed text (memory/search/analysis.py, the analysis conversation search
uses): each term one FTS token, an identifier's words joined by "_" ("qx 4471
zp" -> "qx_4471_zp"). Its tokenizer is `ascii` with "_" as a token character,
so it splits that text at the spaces and nowhere else (words are letters and
digits only; ascii keeps every non-ASCII letter as part of a token), and a
query term, quoted, is that same one token. bm25() over this column is then
the BM25 of the analysed terms, as memory/mongo/keywords.py computes it.

The table stores its own copy of the analysed text (a regular FTS5 table, not
external content: the text it indexes is not a column of `passages`), so a
passage's rows can be deleted by rowid alone, which a trigger does (for
cascades too). Rows are written by the store when it inserts a passage, and
by migration m013 for the passages stored before it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from memory.search.analysis import keyword_terms, terms


def _token(term: str) -> str:
    return term.replace(" ", "_")


def indexed_text(text: str) -> str:
    """What `passages_fts` indexes for a passage's text."""
    return " ".join(_token(term) for term in terms(text))


def term_expressions(query: str) -> list[str]:
    """A query's terms as FTS5 expressions (quoted single tokens, safe to OR)."""
    return [f'"{_token(term)}"' for term in keyword_terms(query)]


def index_passages(conn: sqlite3.Connection, rows: Iterable[tuple[int, str, str]]) -> int:
    """Index (id, agent_id, text) rows in `passages_fts`; how many."""
    values = [(passage_id, agent_id, indexed_text(text)) for passage_id, agent_id, text in rows]
    conn.executemany("INSERT INTO passages_fts (rowid, agent_id, text) VALUES (?, ?, ?)", values)
    return len(values)
