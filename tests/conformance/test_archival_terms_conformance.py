"""Archival search's keyword side on analysed terms (memory/search/analysis.py),
the same on every backend: a stemmed word matches, a query of function words
only has no keyword side, and an exact identifier ranks first among
look-alikes holding all of its words.

Each passage's vector is chosen so that the expected winner is the one the
embedding likes least: only the keyword bonus can put it first, and the
scores of the others stay their plain cosines."""

from __future__ import annotations

import math

from memory.places import Place, Visibility
from memory.search.hybrid import KEYWORD_WEIGHT
from memory.store import Store
from memory.types import Passage
from tests.conformance.test_store_conformance import new_agent

QUERY = [1.0, 0.0]


def unit(angle: float) -> list[float]:
    return [math.cos(angle), math.sin(angle)]


async def archive(store: Store, agent_id: str, texts: list[str], places: list[str] | None = None) -> list[int]:
    """Passages with vectors at falling cosines to QUERY: the first the farthest."""
    passages = [Passage(text, place=(places or ["dm"] * len(texts))[n]) for n, text in enumerate(texts)]
    ids = await store.insert_passages(agent_id, passages)
    angles = [0.9 - 0.1 * n for n in range(len(texts))]
    await store.set_embeddings(agent_id, {pid: unit(a) for pid, a in zip(ids, angles, strict=True)})
    return ids


async def test_a_stemmed_word_finds_its_other_forms(store: Store) -> None:
    agent = await new_agent(store)
    texts = [
        "Caroline is researching adoption agencies.",
        "Caroline went hiking in the mountains.",
        "Melanie painted a sunrise over the lake.",
        "The weather was rainy all week.",
    ]
    ids = await archive(store, agent.id, texts)
    page = await store.search_passages(agent.id, "What did Caroline research?", QUERY, 4)
    # "Caroline" is in half the archive (no weight): "researching" decides.
    assert [p.id for p, _ in page.items] == [ids[0], ids[3], ids[2], ids[1]]
    # "paints" finds "painted"; the unmatched keep their cosine as their score.
    page = await store.search_passages(agent.id, "who paints", QUERY, 4)
    assert [p.id for p, _ in page.items] == [ids[2], ids[3], ids[1], ids[0]]
    scores = dict((p.id, score) for p, score in page.items)
    assert scores[ids[2]] > math.cos(0.7) + 0.5 * KEYWORD_WEIGHT
    for n in (0, 1, 3):
        assert math.isclose(scores[ids[n]], math.cos(0.9 - 0.1 * n), abs_tol=1e-5)


async def test_a_query_of_function_words_only_is_ranked_by_meaning(store: Store) -> None:
    agent = await new_agent(store)
    texts = ["The Who", "who is where, and what of it", "A concert in the park.", "Tickets for the show."]
    ids = await archive(store, agent.id, texts)
    page = await store.search_passages(agent.id, "The Who?", QUERY, 4)
    assert [p.id for p, _ in page.items] == ids[::-1]
    for (passage, score), n in zip(page.items, (3, 2, 1, 0), strict=True):
        assert passage.id == ids[n] and math.isclose(score, math.cos(0.9 - 0.1 * n), abs_tol=1e-5)


async def test_the_exact_identifier_ranks_first_among_look_alikes_with_all_its_words(store: Store) -> None:
    agent = await new_agent(store)
    texts = [
        # The asked-for code, in the longest passage and with the farthest vector.
        "For the gym on the second floor of the east building, the locker code is QX-4471-ZP.",
        "The locker code is ZP-4471-QX.",
        "The locker code is QX 4471 ZP.",
        "The locker code is QX-4471-ZP-2.",
        "Locker code: 4471-QX-ZP.",
    ]
    ids = await archive(store, agent.id, texts)
    page = await store.search_passages(agent.id, "what is the locker code QX-4471-ZP?", QUERY, 5)
    assert page.items[0][0].id == ids[0] and page.total == 5
    # Also when the look-alikes are all a visible place can see of it, and the exact one is hidden.
    other = await new_agent(store, "discord:other")
    places = ["private:C1", "public:C2", "public:C2", "public:C2", "public:C2"]
    ids = await archive(store, other.id, texts, places)
    hidden = await store.search_passages(
        other.id, "locker code QX-4471-ZP", QUERY, 5, visible=Visibility.of(Place("public", "C2"))
    )
    assert ids[0] not in [p.id for p, _ in hidden.items] and hidden.total == 4
    shown = await store.search_passages(
        other.id, "locker code QX-4471-ZP", QUERY, 5, visible=Visibility.of(Place("private", "C1"))
    )
    assert shown.items[0][0].id == ids[0] and shown.total == 5
