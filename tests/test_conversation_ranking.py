"""Conversation search's signals, through a real SQLite file and real embeddings.

Each test builds a history where the asked-for message has a look-alike that
meaning and keywords alone cannot tell apart (or would rank first), so the
test fails if the signal it is about stops working. The same queries with that
signal's weight at 0 show it is the signal that decides.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory.embeddings import Embedder
from memory.recall import RecallMemory
from memory.search.conversation import WEIGHTS, speaker_of
from memory.search.when import parse
from memory.sqlite.store import SQLiteStore
from memory.types import Message

T0 = datetime(2023, 3, 6, 18, 0, tzinfo=UTC)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    backend = SQLiteStore(tmp_path / "recall.db")
    await backend.open()
    yield backend
    await backend.close()


async def history(store: SQLiteStore, sessions: Sequence[tuple[datetime, Sequence[tuple[str, str]]]]) -> str:
    """Sessions of (speaker, text) turns, 30 s apart; speaker A is the user."""
    agent, _ = await store.get_or_create_agent("terminal:alice", [])
    messages = []
    for start, turns in sessions:
        for n, (speaker, text) in enumerate(turns):
            role = "user" if speaker in ("Caroline", "alice") else "assistant"
            at = start + timedelta(seconds=30 * n)
            messages.append(Message(role, f"{speaker}: {text}", name="imported", created_at=at))  # type: ignore[arg-type]
    await store.append_messages(agent.id, messages)
    return agent.id


async def search(store: SQLiteStore, embedder: Embedder, agent_id: str, query: str, limit: int = 10) -> list[str]:
    recall = RecallMemory(store, embedder)
    page = await recall.search(agent_id, query, limit)
    await recall.settle(agent_id)
    page = await recall.search(agent_id, query, limit)
    return [message.content or "" for message in page.items]


SMALL_TALK = [
    ("Caroline", "How was your week?"),
    ("Melanie", "Busy, the kids had exams."),
    ("Caroline", "Mine was quiet, mostly reading."),
]


async def test_a_time_expression_finds_the_turn_from_that_date(
    store: SQLiteStore, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same outing, told in May, July and September: only the date tells.
    told = "Caroline: We went hiking up to the lake with the dogs."
    sessions = [
        (datetime(2023, month, 12, 15, tzinfo=UTC), [*SMALL_TALK, ("Caroline", told.split(": ", 1)[1])])
        for month in (5, 7, 9)
    ]
    agent_id = await history(store, sessions)
    query = "Where did Caroline go hiking in July 2023?"
    found = await search(store, embedder, agent_id, query)
    assert found[0] == told
    index = store._recall.cached_agents[agent_id]
    first = index.rank(query, (await embedder.embed_one(query)).tolist(), 1).items[0][0]
    assert first == 8  # the second session's telling: July
    assert index.rank(query, None, 3, weights=replace(WEIGHTS, time=0.0)).items[0][0] == 4  # May, the first


async def test_a_question_about_one_speaker_ranks_their_turn_first(store: SQLiteStore, embedder: Embedder) -> None:
    # The same words from both, each naming the other: only who said them tells.
    sessions = [
        (T0, [*SMALL_TALK, ("Melanie", "Caroline, I started playing tennis on Sundays.")]),
        (T0 + timedelta(days=3), [*SMALL_TALK, ("Caroline", "Melanie, I started playing tennis on Sundays.")]),
    ]
    agent_id = await history(store, sessions)
    query = "Which sport did Caroline start playing?"
    found = await search(store, embedder, agent_id, query)
    assert found.index("Caroline: Melanie, I started playing tennis on Sundays.") < found.index(
        "Melanie: Caroline, I started playing tennis on Sundays."
    )
    # The embedding of a turn holds its "Name:" too; by words alone, only the
    # speaker signal separates them (a tie goes to the older, Melanie's).
    index = store._recall.cached_agents[agent_id]
    assert index.rank(query, None, 1).items[0][0] == 8
    assert index.rank(query, None, 1, weights=replace(WEIGHTS, speaker=0.0)).items[0][0] == 4


async def test_neighbour_context_finds_a_reply_to_the_questions_topic(store: SQLiteStore, embedder: Embedder) -> None:
    # Each exchange is its own stretch of conversation (hours apart); every
    # answer is a short "yes, in <month>" reply.
    exchanges = [
        ("Is the community pool open again?", "Yes, in May. They fixed the roof."),
        ("Is your sister's wedding still going ahead?", "Yes, in June. We are all flying out."),
        ("Did the bakery on the corner reopen?", "Yes, in April, with new owners."),
        ("Are you still taking the night classes?", "Yes, in March I start the second term."),
    ]
    sessions = [
        (T0 + timedelta(hours=5 * n), [("Melanie", question), ("Caroline", answer)])
        for n, (question, answer) in enumerate(exchanges)
    ]
    agent_id = await history(store, sessions)
    query = "When is Caroline's sister's wedding?"
    found = await search(store, embedder, agent_id, query, 3)
    reply = "Caroline: Yes, in June. We are all flying out."
    assert reply in found[:2]
    index = store._recall.cached_agents[agent_id]
    vector = (await embedder.embed_one(query)).tolist()
    alone = [seq for seq, _ in index.rank(query, vector, 8, weights=replace(WEIGHTS, context=0.0)).items]
    # Without context the reply ranks below another "yes, in <month>" reply.
    assert alone.index(4) > min(alone.index(seq) for seq in (2, 6, 8))


async def test_the_index_follows_what_another_store_writes(tmp_path: Path, embedder: Embedder) -> None:
    first, second = SQLiteStore(tmp_path / "shared.db"), SQLiteStore(tmp_path / "shared.db")
    await first.open()
    await second.open()
    try:
        agent, _ = await first.get_or_create_agent("terminal:alice", [])
        await first.append_messages(agent.id, [Message("user", "alice: the weather is mild")])
        vector = (await embedder.embed_one("a quarrel with the landlord")).tolist()
        assert (await first.search_messages(agent.id, "landlord", 5, query_vector=vector)).total == 0
        # Another process appends and embeds; this one's cached index sees both.
        stored = await second.append_messages(agent.id, [Message("user", "alice: we argued with the owner")])
        await second.set_message_embeddings(agent.id, {stored[0].seq: vector})
        page = await first.search_messages(agent.id, "landlord", 5, query_vector=vector)
        assert [m.content for m in page.items] == ["alice: we argued with the owner"]
        await second.set_message_embeddings(agent.id, {1: vector})
        page = await first.search_messages(agent.id, "landlord", 5, query_vector=vector)
        assert page.total == 2
    finally:
        await first.close()
        await second.close()


def test_speakers_are_read_from_name_prefixes() -> None:
    assert speaker_of("Caroline: hi") == "caroline"
    assert speaker_of("[2024-05-01 10:00 UTC] Mary Ann in #general: hello") == "mary ann"
    assert speaker_of("no prefix here") is None
    assert speaker_of("12:30: lunch") is None


@pytest.mark.parametrize(
    ("query", "start", "end", "rest"),
    [
        ("What did Nate do on 25 May, 2022?", "2022-05-25", "2022-05-26", "What did Nate do on ?"),
        ("Where did Joanna travel to in July 2022?", "2022-07-01", "2022-08-01", "Where did Joanna travel to in ?"),
        ("what happened the week before August 3, 2023", "2023-07-27", "2023-08-04", "what happened"),
        ("what did we say yesterday", "2023-08-19", "2023-08-20", "what did we say"),
        ("plans for summer 2021", "2021-06-01", "2021-09-01", "plans for"),
    ],
)
def test_time_expressions_become_windows(query: str, start: str, end: str, rest: str) -> None:
    timed = parse(query, datetime(2023, 8, 20, 12, tzinfo=UTC))
    assert timed.window is not None
    assert (timed.window.start.date().isoformat(), timed.window.end.date().isoformat()) == (start, end)
    assert timed.text == rest


def test_may_the_verb_is_no_month() -> None:
    assert parse("May I ask what you did?", datetime(2023, 8, 20, tzinfo=UTC)).window is None
    month = parse("Which spot did Joanna visit in May?", datetime(2023, 8, 20, tzinfo=UTC)).window
    assert month is not None and month.any_year
    assert month.contains(datetime(2021, 5, 30, tzinfo=UTC)) and not month.contains(datetime(2021, 6, 3, tzinfo=UTC))
