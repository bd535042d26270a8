"""Places in storage (memory/places.py): every backend records where each
message and passage was said, keeps a queue and a summary per place, and
filters every read by Visibility, before ranking and paging."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory.archival import ArchivalMemory
from memory.embeddings import Embedder
from memory.places import EVERYWHERE, Place, Visibility
from memory.sqlite.store import SQLiteStore
from memory.store import Store, StoreError
from memory.types import Message, Passage
from tests.helpers import new_agent

T0 = datetime(2024, 5, 17, 9, 30, tzinfo=UTC)

PLACES = ["dm", "private:A", "private:B", "public:X", "public:Y"]
# Where a read is made from -> the place keys it may return.
VIEWS: dict[str, tuple[Visibility, set[str]]] = {
    "dm": (Visibility.of(Place()), set(PLACES)),
    "private:A": (Visibility.of(Place("private", "A")), {"private:A", "public:X", "public:Y"}),
    "public:X": (Visibility.of(Place("public", "X")), {"public:X", "public:Y"}),
}
VIEW_NAMES = sorted(VIEWS)


async def fill_messages(store: Store, agent_id: str) -> list[Message]:
    """Two messages per place, interleaved by seq, each naming its place and
    the word "zeppelin", an hour apart."""
    messages = [
        Message(
            "user",
            f"zeppelin note {n} said in {place}",
            created_at=T0 + timedelta(hours=n * len(PLACES) + i),
            place=place,
        )
        for n in range(2)
        for i, place in enumerate(PLACES)
    ]
    return await store.append_messages(agent_id, messages)


async def fill_passages(store: Store, agent_id: str) -> list[int]:
    passages = [
        Passage(f"zeppelin fact {n} saved in {place}", created_at=T0 + timedelta(minutes=i), embedding=[1.0, 0.1 * n])
        for n in range(2)
        for i, place in enumerate(PLACES)
    ]
    for passage, place in zip(passages, PLACES * 2, strict=True):
        passage.place = place
    return await store.insert_passages(agent_id, passages)


def places_of(items: list[Message] | list[Passage]) -> set[str]:
    return {item.place for item in items}


# -- what is stored --------------------------------------------------------
async def test_places_round_trip_and_default_to_dm(store: Store) -> None:
    agent_id = (await new_agent(store)).id
    stored = await fill_messages(store, agent_id)
    await store.append_messages(agent_id, [Message("user", "no place given")])
    back = await store.messages_since(agent_id, 0)
    assert [m.place for m in back] == [m.place for m in stored] + ["dm"]
    await fill_passages(store, agent_id)
    await store.insert_passages(agent_id, [Passage("no place given")])
    listed = await store.list_passages(agent_id, 100)
    assert sorted(p.place for p in listed) == sorted([*PLACES, *PLACES, "dm"])


async def test_each_place_has_its_own_queue(store: Store) -> None:
    agent_id = (await new_agent(store)).id
    stored = await fill_messages(store, agent_id)
    for place in PLACES:
        mine = [m.seq for m in stored if m.place == place]
        assert [m.seq for m in await store.messages_since(agent_id, 1, place=place)] == mine
        # From a start seq on, still only that place's.
        assert [m.seq for m in await store.messages_since(agent_id, mine[1], place=place)] == mine[1:]
    assert await store.messages_since(agent_id, 1, place="public:nowhere") == []
    assert len(await store.messages_since(agent_id, 1)) == len(stored)


# -- conversations ---------------------------------------------------------
async def test_conversations_are_created_on_first_use_and_kept_apart(store: Store) -> None:
    agent_id = (await new_agent(store)).id
    dm = await store.get_conversation(agent_id, "dm")
    assert (dm.agent_id, dm.place, dm.name, dm.summary, dm.queue_start_seq, dm.summary_updated_at) == (
        agent_id,
        "dm",
        "",
        "",
        1,
        None,
    )
    general = await store.get_conversation(agent_id, "public:X", "#general")
    assert (general.place, general.name, general.queue_start_seq) == ("public:X", "#general", 1)

    when = T0 + timedelta(minutes=3)
    await store.update_queue(agent_id, "talked about trains in #general", 7, when, place="public:X")
    await store.update_queue(agent_id, "private chat", 3, T0)
    general = await store.get_conversation(agent_id, "public:X")  # empty name: the stored one stays
    assert (general.name, general.summary, general.queue_start_seq, general.summary_updated_at) == (
        "#general",
        "talked about trains in #general",
        7,
        when,
    )
    renamed = await store.get_conversation(agent_id, "public:X", "#town-square")
    assert renamed.name == "#town-square" and renamed.summary == "talked about trains in #general"
    dm = await store.get_conversation(agent_id, "dm")
    assert (dm.summary, dm.queue_start_seq) == ("private chat", 3)

    # update_queue for a place never opened creates its conversation.
    await store.update_queue(agent_id, "a side room", 2, T0, place="private:A")
    listed = await store.list_conversations(agent_id)
    assert [(c.place, c.summary) for c in listed] == [
        ("dm", "private chat"),
        ("private:A", "a side room"),
        ("public:X", "talked about trains in #general"),
    ]
    other = (await new_agent(store, "discord:bob")).id
    assert await store.list_conversations(other) == []


async def test_concurrent_first_uses_make_one_conversation(store: Store) -> None:
    agent_id = (await new_agent(store)).id
    found = await asyncio.gather(*(store.get_conversation(agent_id, "private:A", "#team") for _ in range(8)))
    assert {(c.place, c.name, c.queue_start_seq) for c in found} == {("private:A", "#team", 1)}
    assert [c.place for c in await store.list_conversations(agent_id)] == ["private:A"]


async def test_conversations_of_unknown_or_deleted_agents(store: Store) -> None:
    with pytest.raises(StoreError, match="no agent"):
        await store.get_conversation("ghost", "dm")
    with pytest.raises(StoreError, match="no agent"):
        await store.update_queue("ghost", "", 1, T0, place="public:X")
    agent_id = (await new_agent(store)).id
    await store.update_queue(agent_id, "secret summary", 2, T0, place="private:A")
    await store.delete_agent(agent_id)
    assert await store.list_conversations(agent_id) == []
    again = (await new_agent(store)).id
    assert await store.list_conversations(again) == []


# -- every read is filtered ------------------------------------------------
@pytest.mark.parametrize("view", VIEW_NAMES)
async def test_message_reads_are_filtered(store: Store, view: str) -> None:
    visible, expected = VIEWS[view]
    agent_id = (await new_agent(store)).id
    stored = await fill_messages(store, agent_id)
    wanted = sum(1 for m in stored if m.place in expected)

    assert await store.count_messages(agent_id, visible=visible) == wanted
    assert await store.count_messages(agent_id) == len(stored)

    page = await store.search_messages(agent_id, "zeppelin", 100, visible=visible)
    assert places_of(page.items) == expected and page.total == len(page.items) == wanted

    vectors = {m.seq: [1.0, 0.1 * n] for n, m in enumerate(stored)}
    await store.set_message_embeddings(agent_id, vectors)
    page = await store.search_messages(agent_id, "zeppelin", 100, query_vector=[1.0, 0.0], visible=visible)
    assert places_of(page.items) == expected and page.total == len(page.items) == wanted

    page = await store.messages_between(agent_id, T0, T0 + timedelta(days=1), 100, visible=visible)
    assert places_of(page.items) == expected and page.total == len(page.items) == wanted
    assert [m.seq for m in page.items] == [m.seq for m in stored if m.place in expected]

    everything = await store.search_messages(agent_id, "zeppelin", 100, visible=EVERYWHERE)
    assert everything.total == len(stored)


@pytest.mark.parametrize("view", VIEW_NAMES)
async def test_passage_reads_are_filtered(store: Store, view: str) -> None:
    visible, expected = VIEWS[view]
    agent_id = (await new_agent(store)).id
    ids = await fill_passages(store, agent_id)
    wanted = sum(1 for place in PLACES * 2 if place in expected)

    assert await store.count_passages(agent_id, visible=visible) == wanted
    assert await store.count_passages(agent_id) == len(ids)
    listed = await store.list_passages(agent_id, 100, visible=visible)
    assert places_of(listed) == expected and len(listed) == wanted
    assert len(await store.list_passages(agent_id, 2, 1, visible=visible)) == 2

    page = await store.search_passages(agent_id, "zeppelin", [1.0, 0.0], 100, visible=visible)
    found = [passage for passage, _ in page.items]
    assert places_of(found) == expected and page.total == len(found) == wanted
    page = await store.search_passages(agent_id, "", [0.0, 1.0], 100, visible=visible)
    assert places_of([p for p, _ in page.items]) == expected


async def test_paging_through_filtered_searches_never_leaks(store: Store) -> None:
    """The invisible items are the best matches; the visible ones are weak.
    Every page holds visible items only, and the pages together hold them all."""
    agent_id = (await new_agent(store)).id
    strong = [Message("user", "zeppelin zeppelin zeppelin", place="private:B") for _ in range(12)]
    weak = [
        Message("user", f"a long note that mentions a zeppelin once among many other words {n}", place=place)
        for n, place in enumerate(["public:X", "public:Y", "private:A"] * 2)
    ]
    await store.append_messages(agent_id, [*strong, *weak])
    passages = [Passage("zeppelin zeppelin", embedding=[1.0, 0.0], place="dm") for _ in range(12)]
    passages += [Passage(f"zeppelin aside {n}", embedding=[0.0, 1.0], place="public:X") for n in range(5)]
    await store.insert_passages(agent_id, passages)
    visible, _ = VIEWS["private:A"]

    for query_vector in (None, [1.0, 0.0]):
        if query_vector is not None:
            everyone = await store.messages_since(agent_id, 1)
            await store.set_message_embeddings(agent_id, {m.seq: [1.0, 0.0] for m in everyone})
        seen: list[int] = []
        for offset in range(0, 10, 2):
            page = await store.search_messages(
                agent_id, "zeppelin", 2, offset, query_vector=query_vector, visible=visible
            )
            assert all(m.place != "private:B" for m in page.items)
            assert page.total == 6
            seen += [m.seq for m in page.items]
        assert len(seen) == len(set(seen)) == 6

    seen = []
    for offset in range(0, 8, 2):
        page = await store.search_passages(agent_id, "zeppelin", [1.0, 0.0], 2, offset, visible=VIEWS["public:X"][0])
        assert all(p.place == "public:X" for p, _ in page.items)
        assert page.total == 5
        seen += [p.id for p, _ in page.items]
    assert len(seen) == len(set(seen)) == 5


async def test_archival_memory_filters_the_agent_but_not_shared_collections(store: Store, embedder: Embedder) -> None:
    agent_id = (await new_agent(store)).id
    archival = ArchivalMemory(store, embedder)
    await archival.insert(
        agent_id,
        [
            Passage("My bank PIN is 4921", place="dm"),
            Passage("The team meets on Tuesdays", place="public:X"),
        ],
    )
    source, _ = await store.create_source("handbook")
    await archival.insert(source.id, [Passage("The office opens at nine")])
    await archival.settle(source.id)
    await store.attach_source(source.id, agent_id)

    page = await archival.search(agent_id, "bank PIN meetings office", 10, visible=VIEWS["public:X"][0])
    texts = {passage.text for passage, _ in page.items}
    assert texts == {"The team meets on Tuesdays", "The office opens at nine"}
    page = await archival.search(agent_id, "bank PIN meetings office", 10, visible=VIEWS["dm"][0])
    assert "My bank PIN is 4921" in {passage.text for passage, _ in page.items}


# -- the approximate (ANN) path --------------------------------------------
ANN_THRESHOLD = 8


@pytest.mark.parametrize(("hidden", "shown"), [(500, 5), (5000, 300), (8, 600)], ids=["handful", "few", "many"])
async def test_ann_searches_are_filtered_too(tmp_path: Path, hidden: int, shown: int) -> None:
    """With an ANN index serving a small archive: the nearest passages are
    invisible; a filtered search returns only visible ones and still finds
    them, whether so few are visible that they are ranked exactly at once
    ("handful"), a pool of them survives the over-fetch ("many"), or too few
    do and the visible ones are ranked exactly ("few")."""
    store = SQLiteStore(tmp_path / "memory.db", ann_threshold=ANN_THRESHOLD)
    await store.open()
    try:
        agent_id = (await new_agent(store)).id
        passages = [Passage(f"hidden {n}", embedding=[1.0, 0.0, 0.0001 * n], place="private:B") for n in range(hidden)]
        passages += [Passage(f"shown {n}", embedding=[0.6, 0.8, 0.001 * n], place="public:X") for n in range(shown)]
        ids = await store.insert_passages(agent_id, passages)
        await store.search_passages(agent_id, "", [1.0, 0.0, 0.0], 1)
        await store.wait_for_search_indexes()
        entry = store._search.cached(agent_id)
        assert entry is not None and entry.ann is not None

        visible = VIEWS["public:X"][0]
        page = await store.search_passages(agent_id, "", [1.0, 0.0, 0.0], 5, visible=visible)
        assert len(page.items) == min(5, shown) and all(p.place == "public:X" for p, _ in page.items)
        assert {p.id for p, _ in page.items} <= set(ids[hidden:])
        page = await store.search_passages(agent_id, "hidden shown", [1.0, 0.0, 0.0], 500, visible=visible)
        assert all(p.place == "public:X" for p, _ in page.items)
        if shown <= 500:
            assert {p.id for p, _ in page.items} == set(ids[hidden:])
        # Unfiltered, the invisible ones are the nearest.
        page = await store.search_passages(agent_id, "", [1.0, 0.0, 0.0], 3)
        assert {p.place for p, _ in page.items} == {"private:B"}
    finally:
        await store.close()


async def test_unseen_neighbours_lend_nothing_to_a_seen_message(store: Store) -> None:
    """Conversation search lifts a turn by its neighbours' words (context); an
    invisible neighbour must not make a visible turn a hit for its secret."""
    agent_id = (await new_agent(store)).id
    await store.append_messages(
        agent_id,
        [
            Message("user", "what should I cook tonight", place="public:X"),
            Message("user", "my locker combination is 4921", place="dm"),
            Message("assistant", "maybe a soup", place="public:X"),
        ],
    )
    query = "locker combination 4921"
    from_dm = await store.search_messages(agent_id, query, 10, query_vector=[1.0, 0.0], visible=VIEWS["dm"][0])
    assert len(from_dm.items) >= 2  # the neighbours are context hits when the secret may be seen
    page = await store.search_messages(agent_id, query, 10, query_vector=[1.0, 0.0], visible=VIEWS["public:X"][0])
    assert page.items == [] and page.total == 0
