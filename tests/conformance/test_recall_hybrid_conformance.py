"""Lazily embedded recall and hybrid recall search, on every Store backend.

Vectors here are made up (unit basis vectors), so the expected ranking follows
from the ranking's signals and weights alone (memory/search/conversation.py):
cosine, plus bonuses for keywords, the keywords of a turn's neighbours, the
next turn's cosine, the speaker and the time named in the query.
"""

from __future__ import annotations

import pytest

from memory.store import Store
from memory.types import Message
from tests.conformance.test_store_conformance import FILLER, contents, new_agent

DIM = 8


def unit(axis: int) -> list[float]:
    vector = [0.0] * DIM
    vector[axis] = 1.0
    return vector


TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "send_message", "arguments": '{"message": "hi"}'}}


async def test_backlog_is_newest_first_and_only_words_people_and_agent_wrote(store: Store) -> None:
    agent = await new_agent(store)
    other = await new_agent(store, "discord:bob")
    await store.append_messages(other.id, [Message("user", "bob's own words")])
    stored = await store.append_messages(
        agent.id,
        [
            Message("user", "first words"),
            Message("system", "you are a helpful agent"),
            Message("user", "[system alert] memory pressure", name="system_alert"),
            Message("user", "[event] alice joined", name="user_joined"),
            Message("assistant", "thinking about it", tool_calls=[TOOL_CALL]),
            Message("tool", '{"status": "OK"}', tool_call_id="c1", name="send_message"),
            Message("assistant", None, tool_calls=[TOOL_CALL]),
            Message("assistant", ""),
            Message("user", "last words"),
        ],
    )
    seq = {m.content: m.seq for m in stored}
    pending = await store.messages_without_embedding(agent.id, 10)
    assert contents(pending) == ["last words", "thinking about it", "[event] alice joined", "first words"]
    assert [m.seq for m in pending] == [seq[m.content or ""] for m in pending]
    assert pending[1].tool_calls == [TOOL_CALL]  # whole messages, as stored
    assert pending[2].name == "user_joined"
    assert contents(await store.messages_without_embedding(agent.id, 2)) == ["last words", "thinking about it"]
    assert await store.messages_without_embedding(agent.id, 0) == []

    await store.set_message_embeddings(agent.id, {seq["last words"]: unit(0), seq["thinking about it"]: unit(1)})
    assert contents(await store.messages_without_embedding(agent.id, 10)) == ["[event] alice joined", "first words"]
    # Seqs are the agent's own: bob's seq 1 is not touched through alice.
    await store.set_message_embeddings(
        agent.id, {seq["first words"]: unit(2), seq["[event] alice joined"]: unit(3), 999: unit(4)}
    )
    assert await store.messages_without_embedding(agent.id, 10) == []
    assert contents(await store.messages_without_embedding(other.id, 10)) == ["bob's own words"]
    # Embeddings never come back with the messages.
    assert contents(await store.messages_since(agent.id, 0))[0] == "first words"


async def test_embedding_length_must_match_the_stored_ones(store: Store) -> None:
    agent = await new_agent(store)
    stored = await store.append_messages(agent.id, [Message("user", "one"), Message("user", "two")])
    await store.set_message_embeddings(agent.id, {stored[0].seq: unit(0)})
    with pytest.raises(ValueError):
        await store.set_message_embeddings(agent.id, {stored[1].seq: [1.0, 0.0]})
    assert contents(await store.messages_without_embedding(agent.id, 10)) == ["two"]


async def _archive(store: Store) -> tuple[str, dict[str, int]]:
    agent = await new_agent(store)
    stored = await store.append_messages(
        agent.id,
        [
            *(Message("user", text) for text in FILLER),
            Message("user", "the cat sat on the mat"),
            Message("user", "dogs bark loudly at night"),
            Message("user", "order QX-4471-ZP has shipped"),
            Message("user", "order QX-4471-ZQ has shipped"),
            Message("user", "what a lovely drizzle"),  # never embedded
            Message("tool", "a zeppelin flew over", tool_call_id="c9"),  # never embedded
        ],
    )
    seq = {m.content or "": m.seq for m in stored}
    vectors = {seq[text]: unit(n) for n, text in enumerate(FILLER[: DIM - 3], start=3)}
    vectors |= {
        seq["the cat sat on the mat"]: unit(0),
        seq["dogs bark loudly at night"]: unit(1),
        seq["order QX-4471-ZP has shipped"]: unit(2),
        seq["order QX-4471-ZQ has shipped"]: unit(2),
    }
    await store.set_message_embeddings(agent.id, vectors)
    return agent.id, seq


async def test_hybrid_ranks_by_cosine_plus_keyword_bonuses(store: Store) -> None:
    agent_id, _ = await _archive(store)
    embedded = DIM - 3 + 4

    # Meaning alone: no shared word, the nearest vector comes first.
    page = await store.search_messages(agent_id, "kitten rug", 3, query_vector=unit(0))
    assert contents(page.items)[0] == "the cat sat on the mat"
    assert page.total == embedded  # every embedded message is a candidate (fewer than the pool)

    # An exact code beats a look-alike with the same vector.
    page = await store.search_messages(agent_id, "QX-4471-ZP", 2, query_vector=unit(2))
    assert contents(page.items) == ["order QX-4471-ZP has shipped", "order QX-4471-ZQ has shipped"]

    # A message without a vector (a tool result, or one not embedded yet) is
    # still found by its words, ranked by its keyword bonuses alone: below a
    # perfect cosine, above the rest.
    for query, text in (("zeppelin", "a zeppelin flew over"), ("drizzle", "what a lovely drizzle")):
        page = await store.search_messages(agent_id, query, 3, query_vector=unit(1))
        assert contents(page.items)[:2] == ["dogs bark loudly at night", text]
        assert page.total == embedded + 1


async def test_hybrid_pages_are_disjoint_and_follow_the_full_ranking(store: Store) -> None:
    agent_id, _ = await _archive(store)
    query = "order shipped mat"
    full = await store.search_messages(agent_id, query, 50, query_vector=unit(0))
    assert len(full.items) == full.total
    seen: list[int] = []
    for offset in range(0, full.total + 3, 3):
        page = await store.search_messages(agent_id, query, 3, offset, query_vector=unit(0))
        assert page.total == full.total
        seen.extend(m.seq for m in page.items)
    assert seen == [m.seq for m in full.items]
    assert (await store.search_messages(agent_id, query, 0, query_vector=unit(0))).items == []


async def test_hybrid_search_stays_within_the_agent(store: Store) -> None:
    agent_id, _ = await _archive(store)
    bob = await new_agent(store, "discord:bob")
    stored = await store.append_messages(bob.id, [Message("user", "bob likes the QX-4471-ZP order too")])
    await store.set_message_embeddings(bob.id, {stored[0].seq: unit(2)})
    page = await store.search_messages(bob.id, "QX-4471-ZP cat", 10, query_vector=unit(0))
    assert contents(page.items) == ["bob likes the QX-4471-ZP order too"]
    page = await store.search_messages(agent_id, "bob likes", 50, query_vector=unit(2))
    assert all("bob" not in (m.content or "") for m in page.items)

    await store.delete_agent(agent_id)
    assert await store.messages_without_embedding(agent_id, 10) == []
    page = await store.search_messages(agent_id, "order", 10, query_vector=unit(2))
    assert page.items == [] and page.total == 0
