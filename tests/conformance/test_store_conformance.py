"""Behaviour every Store backend must share. Runs against real databases."""

from __future__ import annotations

import asyncio
import math
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from memory.store import Store
from memory.types import AgentRecord, Block, BlockLine, Message, Passage
from tests.helpers import new_agent as _new_agent


async def new_agent(store: Store, key: str = "discord:alice") -> AgentRecord:
    return await _new_agent(store, key, default_blocks())  # every block: these tests edit persona too


T0 = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)


def default_blocks() -> list[Block]:
    return [
        Block(label="persona", value="I am a patient helper.", limit=2000),
        Block(label="human", value="Nothing known yet.", limit=2000),
    ]


def contents(messages: list[Message]) -> list[str | None]:
    return [m.content for m in messages]


def assert_utc(moment: datetime) -> None:
    assert moment.tzinfo is not None
    assert moment.utcoffset() == timedelta(0)


# -- agents ----------------------------------------------------------------


async def test_get_or_create_creates_once_and_finds(store: Store) -> None:
    agent, blocks = await store.get_or_create_agent("discord:alice", default_blocks())
    assert agent.id and agent.key == "discord:alice"
    dm = await store.get_conversation(agent.id, "dm")
    assert dm.summary == "" and dm.queue_start_seq == 1
    assert dm.summary_updated_at is None
    assert_utc(agent.created_at)
    assert [(b.label, b.value, b.limit) for b in blocks] == [(b.label, b.value, b.limit) for b in default_blocks()]

    again, blocks_again = await store.get_or_create_agent("discord:alice", [])
    assert again == agent
    assert [b.label for b in blocks_again] == ["persona", "human"]
    assert await store.find_agent("discord:alice") == agent
    assert await store.find_agent("discord:nobody") is None


async def test_concurrent_get_or_create_same_key_makes_one_agent(store: Store) -> None:
    results = await asyncio.gather(*(store.get_or_create_agent("slack:bob", default_blocks()) for _ in range(20)))
    assert len({agent.id for agent, _ in results}) == 1
    assert len(await store.list_agents()) == 1
    assert len(await store.load_blocks(results[0][0].id)) == 2


async def test_list_agents_oldest_first(store: Store) -> None:
    created = [await new_agent(store, f"discord:user{n}") for n in range(4)]
    assert [a.id for a in await store.list_agents()] == [a.id for a in created]


async def test_delete_agent_removes_everything(store: Store) -> None:
    doomed = await new_agent(store, "discord:doomed")
    kept = await new_agent(store, "discord:kept")
    for agent in (doomed, kept):
        await store.append_messages(agent.id, [Message("user", "remember the zeppelin", created_at=T0)])
        await store.save_block(agent.id, Block("notes", "zeppelin fan", 100))
        ids = await store.insert_passages(agent.id, [Passage("zeppelin facts"), Passage("x")])
        await store.set_embeddings(agent.id, {ids[0]: [1.0, 0.0]})
        await store.update_queue(agent.id, "talked about zeppelins", 1, T0)

    await store.delete_agent(doomed.id)

    assert await store.find_agent("discord:doomed") is None
    assert [a.id for a in await store.list_agents()] == [kept.id]
    assert await store.load_blocks(doomed.id) == []
    assert await store.count_messages(doomed.id) == 0
    assert await store.messages_since(doomed.id, 0) == []
    page = await store.search_messages(doomed.id, "zeppelin", 10)
    assert (page.items, page.total) == ([], 0)
    page = await store.messages_between(doomed.id, T0 - timedelta(days=1), T0 + timedelta(1), 10)
    assert (page.items, page.total) == ([], 0)
    assert await store.count_passages(doomed.id) == 0
    assert await store.list_passages(doomed.id, 10) == []
    assert await store.passages_without_embedding(doomed.id) == []
    page = await store.search_passages(doomed.id, "zeppelin", [1.0, 0.0], 10)
    assert (page.items, page.total) == ([], 0)

    # The other agent is untouched.
    assert await store.count_messages(kept.id) == 1
    assert (await store.search_messages(kept.id, "zeppelin", 10)).total == 1
    assert (await store.search_passages(kept.id, "", [1.0, 0.0], 10)).total == 1
    assert len(await store.load_blocks(kept.id)) == 3

    # The same key later starts a fresh agent.
    reborn = await new_agent(store, "discord:doomed")
    assert reborn.id != doomed.id
    assert await store.count_messages(reborn.id) == 0


async def test_delete_unknown_agent_is_harmless(store: Store) -> None:
    agent = await new_agent(store)
    await store.delete_agent("no-such-agent")
    assert [a.id for a in await store.list_agents()] == [agent.id]


# -- working context -------------------------------------------------------


async def test_blocks_round_trip_and_keep_their_order(store: Store) -> None:
    agent = await new_agent(store)
    when = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    notes = Block("notes", "likes tea", 300, updated_at=when)
    await store.save_block(agent.id, notes)
    blocks = await store.load_blocks(agent.id)
    assert [b.label for b in blocks] == ["persona", "human", "notes"]
    assert blocks[2] == notes
    assert_utc(blocks[2].updated_at)


async def test_block_lines_keep_their_place_time_id_and_sharing(store: Store) -> None:
    agent = await new_agent(store)
    lines = [
        BlockLine("diagnosed with hypothyroidism", "dm", T0),
        BlockLine("works on the atlas project", "private:G1", T0 + timedelta(microseconds=1)),
        BlockLine("grows tomatoes, café au lait", "dm", T0 + timedelta(hours=1), shared=True),
        BlockLine("likes the lunch place", "public:C1", T0 + timedelta(days=1)),
    ]
    await store.save_block(agent.id, Block("human", limit=2000, lines=lines, updated_at=T0))
    [loaded] = [b for b in await store.load_blocks(agent.id) if b.label == "human"]
    assert loaded.lines == lines
    assert all(line.written_at.utcoffset() == timedelta(0) for line in loaded.lines)
    await store.save_block(agent.id, Block("human", limit=2000, lines=lines[1:], updated_at=T0))
    [loaded] = [b for b in await store.load_blocks(agent.id) if b.label == "human"]
    assert loaded.lines == lines[1:], "a save replaces the block's lines whole"


async def test_save_block_replaces_whole_block_in_place(store: Store) -> None:
    agent = await new_agent(store)
    later = T0 + timedelta(hours=1)
    terse = Block("persona", "I am terse.", 150, updated_at=later)
    await store.save_block(agent.id, terse)
    blocks = await store.load_blocks(agent.id)
    assert [b.label for b in blocks] == ["persona", "human"]
    assert blocks[0] == terse


# -- FIFO queue state ------------------------------------------------------


async def test_update_queue_round_trips(store: Store) -> None:
    agent = await new_agent(store)
    when = T0 + timedelta(minutes=5)
    await store.update_queue(agent.id, "The user likes trains.", 42, when)
    found = await store.get_conversation(agent.id, "dm")
    assert (found.summary, found.queue_start_seq, found.summary_updated_at) == (
        "The user likes trains.",
        42,
        when,
    )
    assert found.summary_updated_at is not None
    assert_utc(found.summary_updated_at)
    again = await store.find_agent(agent.key)
    assert again is not None and again.created_at == agent.created_at


# -- recall storage: appending ---------------------------------------------


async def test_append_assigns_consecutive_seqs_to_the_same_objects(store: Store) -> None:
    agent = await new_agent(store)
    batch = [Message("user", "one"), Message("assistant", "two"), Message("user", "three")]
    returned = await store.append_messages(agent.id, batch)
    assert [m.seq for m in returned] == [1, 2, 3]
    assert all(a is b for a, b in zip(returned, batch, strict=True))
    more = await store.append_messages(agent.id, [Message("user", "4"), Message("user", "5")])
    assert [m.seq for m in more] == [4, 5]
    assert await store.count_messages(agent.id) == 5


async def test_messages_round_trip_every_field(store: Store) -> None:
    agent = await new_agent(store)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "archival_memory_search", "arguments": '{"query": "tea"}'},
    }
    plus_two = timezone(timedelta(hours=2))
    sent = [
        Message("system", "You are MemGPT.", created_at=T0),
        Message("user", "hi ünïcode 🦄", name="alice", created_at=T0 + timedelta(seconds=1)),
        Message("assistant", None, tool_calls=[call], created_at=T0 + timedelta(seconds=2)),
        Message(
            "tool",
            '{"status": "OK"}',
            tool_call_id="call_1",
            name="archival_memory_search",
            created_at=datetime(2024, 5, 17, 11, 30, 18, 5, tzinfo=plus_two),
        ),
    ]
    await store.append_messages(agent.id, sent)
    got = await store.messages_since(agent.id, 1)
    assert got == sent
    for message in got:
        assert_utc(message.created_at)
    assert got[2].tool_calls == [call]


async def test_messages_since_returns_the_suffix(store: Store) -> None:
    agent = await new_agent(store)
    await store.append_messages(agent.id, [Message("user", f"m{n}") for n in range(1, 8)])
    since = await store.messages_since(agent.id, 5)
    assert [(m.seq, m.content) for m in since] == [(5, "m5"), (6, "m6"), (7, "m7")]
    assert await store.messages_since(agent.id, 8) == []
    assert len(await store.messages_since(agent.id, 0)) == 7


async def test_concurrent_appends_give_gap_free_unique_seqs(store: Store) -> None:
    agent = await new_agent(store)

    async def append(task: int) -> list[Message]:
        pair = [Message("user", f"task {task} a"), Message("assistant", f"task {task} b")]
        return await store.append_messages(agent.id, pair)

    results = await asyncio.gather(*(append(n) for n in range(50)))
    seqs = sorted(m.seq for pair in results for m in pair)
    assert seqs == list(range(1, 101))
    # Each call is one transaction: its two messages are adjacent and in order.
    for pair in results:
        assert pair[1].seq == pair[0].seq + 1
        assert pair[0].content is not None and pair[0].content.endswith(" a")
    stored = await store.messages_since(agent.id, 1)
    assert [m.seq for m in stored] == list(range(1, 101))
    assert await store.count_messages(agent.id) == 100


# -- recall storage: text search -------------------------------------------


FILLER = [
    "the weather is nice indeed",
    "we had pasta for dinner indeed",
    "my cat sleeps all day indeed",
    "the train was late again indeed",
    "I finished reading the novel",
    "let us meet on monday morning",
    "the garden needs watering soon",
    "coffee tastes better in the morning",
    "football practice moved to friday",
    "the concert tickets sold out quickly",
    "please remind me about the dentist",
    "the library closes early on sundays",
]


async def test_search_ranks_by_relevance_not_insertion_order(store: Store) -> None:
    agent = await new_agent(store)
    await store.append_messages(agent.id, [Message("user", text) for text in FILLER])
    await store.append_messages(
        agent.id,
        [
            Message("user", "my favourite colour is purple"),
            Message("user", "I saw a purple giraffe eating leaves"),
            Message("user", "giraffes are tall"),
            Message("user", "the zoo was closed because of the heavy storm last night"),
        ],
    )
    page = await store.search_messages(agent.id, "purple giraffe", 10)
    assert page.total == 3  # stemmed as conversation search is: "giraffes" holds "giraffe"
    assert contents(page.items)[0] == "I saw a purple giraffe eating leaves"
    assert set(contents(page.items)[1:]) == {"my favourite colour is purple", "giraffes are tall"}
    # Stop words are not keywords; a query of nothing else still finds their plain matches.
    page = await store.search_messages(agent.id, "because of the", 10)
    assert contents(page.items)[0] == "the zoo was closed because of the heavy storm last night"

    # A rare term outweighs a common one, even in a longer message: "zoo" is in
    # one message, "indeed" in four shorter ones that were stored first.
    page = await store.search_messages(agent.id, "indeed zoo", 10)
    assert page.total == 5
    assert contents(page.items)[0] == "the zoo was closed because of the heavy storm last night"


async def test_search_pages_are_disjoint_and_cover_all_matches(store: Store) -> None:
    agent = await new_agent(store)
    texts = [f"note {n}: the lighthouse keeper " + "lamp " * (n % 4) for n in range(11)]
    await store.append_messages(agent.id, [Message("user", t) for t in texts + FILLER])
    full = await store.search_messages(agent.id, "lighthouse lamp", 50)
    assert full.total == 11 and len(full.items) == 11
    seen: list[int] = []
    for offset in range(0, 12, 4):
        page = await store.search_messages(agent.id, "lighthouse lamp", 4, offset)
        assert page.total == 11
        seen.extend(m.seq for m in page.items)
    assert seen == [m.seq for m in full.items]
    assert len(set(seen)) == 11
    assert (await store.search_messages(agent.id, "lighthouse", 4, 20)).items == []


async def test_search_covers_tool_call_arguments_and_ignores_accents_and_case(
    store: Store,
) -> None:
    agent = await new_agent(store)
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "core_memory_append", "arguments": '{"content": "rhubarb pie"}'},
    }
    await store.append_messages(
        agent.id,
        [
            *(Message("user", t) for t in FILLER),
            Message("assistant", None, tool_calls=[call]),
            Message("user", "Meet me at the Café Noir"),
        ],
    )
    page = await store.search_messages(agent.id, "rhubarb", 10)
    assert page.total == 1 and page.items[0].tool_calls == [call]
    for query in ("cafe", "CAFÉ", "café noir"):
        page = await store.search_messages(agent.id, query, 10)
        assert contents(page.items) == ["Meet me at the Café Noir"], query


WEIRD_QUERIES = [
    '"',
    '""',
    '"unbalanced',
    "AND",
    "OR NOT",
    "*",
    "tea*",
    "-tea",
    "NEAR(tea cake)",
    "content:tea",
    "(((",
    "tea) OR (",
    "'; DROP TABLE messages; --",
    "🦄",
    "ünïcödé",
    "!!!???",
    "\\",
    "\x00",
    "tea" * 400,
    "a " * 500,
    "^tea",
    "{tea}",
    "tea + cake",
]


@pytest.mark.parametrize("query", WEIRD_QUERIES)
async def test_weird_queries_never_raise(store: Store, query: str) -> None:
    agent = await new_agent(store)
    await store.append_messages(
        agent.id, [Message("user", "tea and cake with 🦄 unicorns"), Message("user", "nothing")]
    )
    page = await store.search_messages(agent.id, query, 5)
    assert page.total >= len(page.items) >= 0


async def test_empty_queries_find_nothing(store: Store) -> None:
    agent = await new_agent(store)
    await store.append_messages(agent.id, [Message("user", "tea and cake")])
    for query in ("", "   ", "\n\t", "?!.,;"):
        page = await store.search_messages(agent.id, query, 5)
        assert (page.items, page.total) == ([], 0)
    page = await store.search_messages(agent.id, '🦄 "cake"', 5)
    assert contents(page.items) == ["tea and cake"]


# -- recall storage: date search -------------------------------------------


async def test_messages_between_start_inclusive_end_exclusive(store: Store) -> None:
    agent = await new_agent(store)
    hours = [T0 + timedelta(hours=h) for h in range(4)]
    await store.append_messages(agent.id, [Message("user", f"h{n}", created_at=at) for n, at in enumerate(hours)])
    page = await store.messages_between(agent.id, hours[1], hours[3], 10)
    assert contents(page.items) == ["h1", "h2"] and page.total == 2
    page = await store.messages_between(agent.id, hours[1], hours[1], 10)
    assert (page.items, page.total) == ([], 0)
    just_after = hours[0] + timedelta(microseconds=1)
    page = await store.messages_between(agent.id, just_after, hours[2], 10)
    assert contents(page.items) == ["h1"]


async def test_messages_between_oldest_first_with_paging(store: Store) -> None:
    agent = await new_agent(store)
    minutes = list(range(10))
    random.Random(7).shuffle(minutes)
    await store.append_messages(
        agent.id,
        [Message("user", f"m{m}", created_at=T0 + timedelta(minutes=m)) for m in minutes],
    )
    start, end = T0, T0 + timedelta(hours=1)
    pages = [await store.messages_between(agent.id, start, end, 4, off) for off in (0, 4, 8)]
    assert [page.total for page in pages] == [10, 10, 10]
    assert [len(page.items) for page in pages] == [4, 4, 2]
    assert [m.content for page in pages for m in page.items] == [f"m{m}" for m in range(10)]


# -- isolation -------------------------------------------------------------


async def test_agents_never_see_each_others_memory(store: Store) -> None:
    alice = await new_agent(store, "discord:alice")
    bob = await new_agent(store, "discord:bob")
    for agent, who in ((alice, "alice"), (bob, "bob")):
        await store.append_messages(
            agent.id,
            [
                Message("user", f"banana bread recipe from {who}", created_at=T0),
                *(Message("user", f"filler {who} {n}", created_at=T0) for n in range(3)),
            ],
        )
        ids = await store.insert_passages(agent.id, [Passage(f"banana fact by {who}"), Passage(f"pending {who}")])
        await store.set_embeddings(agent.id, {ids[0]: [0.6, 0.8]})

    for agent, who, other in ((alice, "alice", "bob"), (bob, "bob", "alice")):
        texts: list[str] = []
        page = await store.search_messages(agent.id, f"banana recipe {other}", 10)
        assert page.total == 1
        texts += [m.content or "" for m in page.items]
        page = await store.messages_between(agent.id, T0, T0 + timedelta(1), 10)
        assert page.total == 4
        texts += [m.content or "" for m in page.items]
        texts += [m.content or "" for m in await store.messages_since(agent.id, 0)]
        page = await store.search_passages(agent.id, "banana", [0.6, 0.8], 10)
        assert page.total == 1
        texts += [p.text for p, _ in page.items]
        texts += [p.text for p in await store.list_passages(agent.id, 10)]
        texts += [p.text for p in await store.passages_without_embedding(agent.id)]
        assert await store.count_messages(agent.id) == 4
        assert await store.count_passages(agent.id) == 2
        assert all(other not in text for text in texts)
        assert sum(who in text for text in texts) == len(texts)


# -- archival storage ------------------------------------------------------


async def test_insert_passages_returns_ids_in_order(store: Store) -> None:
    agent = await new_agent(store)
    passages = [
        Passage("first", source="notes.pdf", position="p1", created_at=T0),
        Passage("second", source="notes.pdf", position="p2", created_at=T0 + timedelta(1)),
        Passage("third", created_at=T0 + timedelta(2)),
    ]
    ids = await store.insert_passages(agent.id, passages)
    assert len(set(ids)) == 3 and all(isinstance(i, int) for i in ids)
    assert await store.count_passages(agent.id) == 3
    listed = await store.list_passages(agent.id, 10)
    assert [(p.id, p.text, p.source, p.position, p.created_at) for p in listed] == [
        (i, p.text, p.source, p.position, p.created_at) for i, p in zip(ids, passages, strict=True)
    ]
    assert_utc(listed[0].created_at)
    assert [p.text for p in await store.list_passages(agent.id, 2, 1)] == ["second", "third"]
    more = await store.insert_passages(agent.id, [Passage("fourth")])
    assert more[0] not in ids


async def test_passages_are_not_searchable_until_embedded(store: Store) -> None:
    agent = await new_agent(store)
    ids = await store.insert_passages(agent.id, [Passage("a"), Passage("b"), Passage("c")])
    page = await store.search_passages(agent.id, "a", [1.0, 0.0], 10)
    assert (page.items, page.total) == ([], 0)
    assert [p.id for p in await store.passages_without_embedding(agent.id)] == ids

    await store.set_embeddings(agent.id, {ids[1]: [1.0, 0.0]})
    assert [p.id for p in await store.passages_without_embedding(agent.id)] == [ids[0], ids[2]]
    page = await store.search_passages(agent.id, "b", [1.0, 0.0], 10)
    assert page.total == 1 and [p.id for p, _ in page.items] == [ids[1]]


async def test_search_passages_ranks_by_cosine(store: Store) -> None:
    agent = await new_agent(store)
    texts = ["opposite", "orthogonal", "close", "same direction, longer"]
    vectors = [[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.8, 0.6, 0.0], [5.0, 0.0, 0.0]]
    ids = await store.insert_passages(agent.id, [Passage(t) for t in texts])
    await store.set_embeddings(agent.id, dict(zip(ids, vectors, strict=True)))
    page = await store.search_passages(agent.id, "", [2.0, 0.0, 0.0], 10)
    assert page.total == 4
    assert [p.text for p, _ in page.items] == [
        "same direction, longer",
        "close",
        "orthogonal",
        "opposite",
    ]
    scores = [score for _, score in page.items]
    for got, want in zip(scores, [1.0, 0.8, 0.0, -1.0], strict=True):
        assert math.isclose(got, want, abs_tol=1e-5)


async def test_passage_embedding_given_at_insert_is_searchable(store: Store) -> None:
    agent = await new_agent(store)
    ids = await store.insert_passages(agent.id, [Passage("ready", embedding=[0.0, 1.0]), Passage("later")])
    page = await store.search_passages(agent.id, "", [0.0, 1.0], 10)
    assert [p.id for p, _ in page.items] == [ids[0]]
    assert [p.id for p in await store.passages_without_embedding(agent.id)] == [ids[1]]


async def test_search_passages_paging(store: Store) -> None:
    agent = await new_agent(store)
    angles = [n * 0.1 for n in range(10)]
    ids = await store.insert_passages(agent.id, [Passage(f"angle {a:.1f}") for a in angles])
    await store.set_embeddings(agent.id, {i: [math.cos(a), math.sin(a)] for i, a in zip(ids, angles, strict=True)})
    full = await store.search_passages(agent.id, "", [1.0, 0.0], 10)
    assert [p.id for p, _ in full.items] == ids
    seen: list[int] = []
    for offset in (0, 3, 6, 9):
        page = await store.search_passages(agent.id, "", [1.0, 0.0], 3, offset)
        assert page.total == 10
        seen.extend(p.id for p, _ in page.items)
    assert seen == ids
    assert (await store.search_passages(agent.id, "", [1.0, 0.0], 3, 30)).items == []


async def test_search_follows_new_embeddings_and_deletes(store: Store) -> None:
    agent = await new_agent(store)
    ids = await store.insert_passages(agent.id, [Passage("x"), Passage("y")])
    await store.set_embeddings(agent.id, {ids[0]: [1.0, 0.0], ids[1]: [0.0, 1.0]})
    first = await store.search_passages(agent.id, "", [1.0, 0.0], 1)
    assert first.items[0][0].text == "x"

    # Re-embedding replaces, new passages join, deleted ones leave.
    await store.set_embeddings(agent.id, {ids[0]: [-1.0, 0.0]})
    [new_id] = await store.insert_passages(agent.id, [Passage("z")])
    await store.set_embeddings(agent.id, {new_id: [0.9, 0.1]})
    page = await store.search_passages(agent.id, "", [1.0, 0.0], 10)
    assert [p.text for p, _ in page.items] == ["z", "y", "x"]

    await store.delete_passages(agent.id, [new_id, ids[1]])
    page = await store.search_passages(agent.id, "", [1.0, 0.0], 10)
    assert [p.text for p, _ in page.items] == ["x"] and page.total == 1
    assert await store.count_passages(agent.id) == 1
    assert [p.text for p in await store.list_passages(agent.id, 10)] == ["x"]


async def test_one_agent_cannot_embed_or_delete_anothers_passages(store: Store) -> None:
    alice = await new_agent(store, "discord:alice")
    mallory = await new_agent(store, "discord:mallory")
    [passage_id] = await store.insert_passages(alice.id, [Passage("alice's secret")])

    await store.set_embeddings(mallory.id, {passage_id: [1.0, 0.0]})
    await store.delete_passages(mallory.id, [passage_id])

    assert [p.id for p in await store.passages_without_embedding(alice.id)] == [passage_id]
    assert (await store.search_passages(alice.id, "", [1.0, 0.0], 10)).total == 0
    assert (await store.search_passages(mallory.id, "", [1.0, 0.0], 10)).total == 0
    assert await store.count_passages(alice.id) == 1


# -- hybrid ranking: meaning plus keywords ---------------------------------


async def test_search_passages_exact_string_beats_closer_vectors(store: Store) -> None:
    agent = await new_agent(store)
    texts = [
        "The locker code is QX-4471-ZP.",
        "The locker code is QX-4417-ZP.",
        "The locker code is QZ-4471-XP.",
        "Lockers are cleaned on Fridays.",
    ]
    # The passage holding the asked-for code has the least similar vector.
    vectors = [[0.6, 0.8], [0.99, 0.14], [0.97, 0.24], [0.95, 0.31]]
    ids = await store.insert_passages(agent.id, [Passage(t) for t in texts])
    await store.set_embeddings(agent.id, dict(zip(ids, vectors, strict=True)))

    page = await store.search_passages(agent.id, "what is locker code QX-4471-ZP?", [1.0, 0.0], 4)
    assert page.items[0][0].id == ids[0]
    assert page.total == 4
    # Without query text the order is the cosine order, scores the cosines.
    page = await store.search_passages(agent.id, "", [1.0, 0.0], 4)
    assert [p.id for p, _ in page.items] == [ids[1], ids[2], ids[3], ids[0]]
    assert math.isclose(page.items[-1][1], 0.6, abs_tol=1e-5)


async def test_search_passages_keyword_bonus_needs_an_embedding_and_respects_agents(store: Store) -> None:
    alice = await new_agent(store, "discord:alice")
    bob = await new_agent(store, "discord:bob")
    [bobs] = await store.insert_passages(bob.id, [Passage("zanzibar token 99-ALPHA")])
    await store.set_embeddings(bob.id, {bobs: [1.0, 0.0]})
    ids = await store.insert_passages(alice.id, [Passage("zanzibar token 99-ALPHA"), Passage("plain note")])
    await store.set_embeddings(alice.id, {ids[1]: [1.0, 0.0]})

    page = await store.search_passages(alice.id, "zanzibar 99-ALPHA", [1.0, 0.0], 10)
    assert [p.id for p, _ in page.items] == [ids[1]] and page.total == 1
    # Once embedded it competes, and the keyword bonus lifts it over a closer vector.
    await store.set_embeddings(alice.id, {ids[0]: [0.8, 0.6]})
    page = await store.search_passages(alice.id, "zanzibar 99-ALPHA", [1.0, 0.0], 10)
    assert [p.id for p, _ in page.items] == [ids[0], ids[1]]


async def test_hybrid_pages_are_disjoint_and_cover_every_embedded_passage(store: Store) -> None:
    agent = await new_agent(store)
    rng = random.Random(5)
    texts = [
        f"note {n} about {rng.choice(['apples', 'pears', 'plums'])} and {rng.choice(['tea', 'milk'])}"
        for n in range(17)
    ]
    ids = await store.insert_passages(agent.id, [Passage(t) for t in texts])
    angles = [rng.uniform(0, math.pi) for _ in ids]
    await store.set_embeddings(agent.id, {i: [math.cos(a), math.sin(a)] for i, a in zip(ids, angles, strict=True)})
    full = await store.search_passages(agent.id, "pears with milk", [1.0, 0.2], 17)
    assert sorted(p.id for p, _ in full.items) == sorted(ids) and full.total == 17
    scores = [score for _, score in full.items]
    assert scores == sorted(scores, reverse=True)
    seen: list[int] = []
    for offset in range(0, 17, 4):
        page = await store.search_passages(agent.id, "pears with milk", [1.0, 0.2], 4, offset)
        assert page.total == 17
        seen.extend(p.id for p, _ in page.items)
    assert seen == [p.id for p, _ in full.items]


async def test_passage_embedding_length_mismatch_is_refused_before_writing(store: Store) -> None:
    agent = await new_agent(store, "discord:dims")
    ids = await store.insert_passages(agent.id, [Passage("a"), Passage("b")])
    await store.set_embeddings(agent.id, {ids[0]: [1.0, 0.0]})
    with pytest.raises(ValueError):  # differs from the stored length
        await store.set_embeddings(agent.id, {ids[1]: [1.0, 0.0, 0.0]})
    with pytest.raises(ValueError):  # differ from each other
        await store.set_embeddings(agent.id, {ids[1]: [1.0], ids[0]: [1.0, 0.0]})
    assert [p.id for p in await store.passages_without_embedding(agent.id)] == [ids[1]]
