"""Shared collections and loaded-document bookkeeping: behaviour every Store
backend must share (see SourceStore and DocumentStore in memory/roles.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from memory.store import DocumentRecord, SourceRecord, Store, source_key
from memory.types import Passage
from tests.helpers import new_agent

T0 = datetime(2024, 5, 17, 9, 30, 15, tzinfo=UTC)


def names(sources: list[SourceRecord]) -> list[str]:
    return [source.name for source in sources]


# -- collections -----------------------------------------------------------------
async def test_create_source_once_and_find_it(store: Store) -> None:
    docs, created = await store.create_source("docs")
    assert created and docs.name == "docs" and not docs.attach_all
    assert docs.created_at.tzinfo is not None
    again, created_again = await store.create_source("docs")
    assert again == docs and not created_again
    assert await store.find_source("docs") == docs
    assert await store.find_source("nope") is None
    # The collection's passages live under an agent record of its own.
    record = await store.find_agent(source_key("docs"))
    assert record is not None and record.id == docs.id
    await store.create_source("archive")
    assert names(await store.list_sources()) == ["archive", "docs"]


async def test_concurrent_create_source_makes_one(store: Store) -> None:
    results = await asyncio.gather(*(store.create_source("faq") for _ in range(10)))
    assert len({source.id for source, _ in results}) == 1
    assert sum(created for _, created in results) == 1


async def test_attach_and_detach_one_agent(store: Store) -> None:
    docs, _ = await store.create_source("docs")
    faq, _ = await store.create_source("faq")
    alice = await new_agent(store, "discord:alice")
    bob = await new_agent(store, "discord:bob")
    assert await store.attached_sources(alice.id) == []

    await store.attach_source(docs.id, alice.id)
    await store.attach_source(faq.id, alice.id)
    await store.attach_source(docs.id, alice.id)  # idempotent
    assert names(await store.attached_sources(alice.id)) == ["docs", "faq"]
    assert await store.attached_sources(bob.id) == []
    assert await store.source_attachments(docs.id) == [alice.id]

    await store.detach_source(docs.id, alice.id)
    assert names(await store.attached_sources(alice.id)) == ["faq"]
    assert await store.source_attachments(docs.id) == []


async def test_attach_all_covers_agents_created_later(store: Store) -> None:
    docs, _ = await store.create_source("docs")
    before = await new_agent(store, "slack:T1:U1")
    await store.attach_source(docs.id, None)
    after = await new_agent(store, "slack:T1:U2")
    assert (await store.find_source("docs")) == SourceRecord(docs.id, "docs", docs.created_at, True)
    assert names(await store.attached_sources(before.id)) == ["docs"]
    assert names(await store.attached_sources(after.id)) == ["docs"]
    # Never attached to itself, so a collection's own search stays its own.
    assert await store.attached_sources(docs.id) == []

    # A detach for one agent holds even though the collection is attached to all ...
    await store.detach_source(docs.id, before.id)
    assert await store.attached_sources(before.id) == []
    assert names(await store.attached_sources(after.id)) == ["docs"]
    # ... until it is attached to all again.
    await store.attach_source(docs.id, None)
    assert names(await store.attached_sources(before.id)) == ["docs"]

    # Detaching from all removes the flag and every single attachment.
    await store.attach_source(docs.id, before.id)
    await store.detach_source(docs.id, None)
    assert await store.attached_sources(before.id) == []
    assert await store.attached_sources(after.id) == []
    assert await store.source_attachments(docs.id) == []
    assert not (await store.find_source("docs") or docs).attach_all


async def test_deleting_a_collection_or_an_agent_removes_attachments(store: Store) -> None:
    docs, _ = await store.create_source("docs")
    faq, _ = await store.create_source("faq")
    alice = await new_agent(store, "discord:alice")
    bob = await new_agent(store, "discord:bob")
    for agent in (alice, bob):
        await store.attach_source(docs.id, agent.id)
        await store.attach_source(faq.id, agent.id)
    await store.insert_passages(docs.id, [Passage("collection text")])

    await store.delete_agent(docs.id)
    assert await store.find_source("docs") is None
    assert names(await store.list_sources()) == ["faq"]
    assert names(await store.attached_sources(alice.id)) == ["faq"]

    await store.delete_agent(bob.id)
    assert await store.source_attachments(faq.id) == [alice.id]


# -- loaded documents and passage hashes -------------------------------------------
async def test_record_and_list_documents_per_agent(store: Store) -> None:
    alice = await new_agent(store, "discord:alice")
    bob = await new_agent(store, "discord:bob")
    first = DocumentRecord("a" * 64, "guide.md", 3, T0)
    second = DocumentRecord("b" * 64, "docs/faq.pdf", 7, T0 + timedelta(seconds=5))
    await store.record_document(alice.id, second)
    await store.record_document(alice.id, first)
    assert await store.list_documents(alice.id) == [first, second]
    assert await store.list_documents(bob.id) == []
    # Recording the same bytes again replaces the record.
    renamed = DocumentRecord("a" * 64, "guide-copy.md", 3, T0 + timedelta(seconds=9))
    await store.record_document(alice.id, renamed)
    assert await store.list_documents(alice.id) == [second, renamed]

    await store.delete_agent(alice.id)
    assert await store.list_documents(alice.id) == []


async def test_insert_hashed_passages_skips_what_the_agent_holds(store: Store) -> None:
    alice = await new_agent(store, "discord:alice")
    bob = await new_agent(store, "discord:bob")
    first = [Passage("one", source="f.md", embedding=[1.0, 0.0]), Passage("two", source="f.md", embedding=[0.0, 1.0])]
    ids = await store.insert_hashed_passages(alice.id, first, ["h1", "h2"])
    assert all(ids) and [p.id for p in first] == ids
    assert await store.known_passage_hashes(alice.id, ["h1", "h2", "h3"]) == {"h1", "h2"}
    assert await store.known_passage_hashes(bob.id, ["h1"]) == set()

    again = [Passage("two"), Passage("three"), Passage("three, repeated in the same call")]
    ids = await store.insert_hashed_passages(alice.id, again, ["h2", "h3", "h3"])
    assert ids[0] == 0 and ids[1] > 0 and ids[2] == 0
    assert await store.count_passages(alice.id) == 3
    # Hashes are per agent: another agent stores the same content.
    assert all(await store.insert_hashed_passages(bob.id, [Passage("one")], ["h1"]))

    # Vectors given with the passages are searchable at once.
    page = await store.search_passages(alice.id, "one", [1.0, 0.0], 1)
    assert page.items[0][0].text == "one"

    # Deleting a passage forgets its hash, so loading it again stores it again.
    await store.delete_passages(alice.id, [first[0].id])
    assert await store.known_passage_hashes(alice.id, ["h1", "h2"]) == {"h2"}
    assert all(await store.insert_hashed_passages(alice.id, [Passage("one")], ["h1"]))


async def test_forgetting_an_agent_forgets_its_hashes(store: Store) -> None:
    alice = await new_agent(store, "discord:alice")
    await store.insert_hashed_passages(alice.id, [Passage("secret")], ["hash-of-secret"])
    await store.delete_agent(alice.id)
    assert await store.known_passage_hashes(alice.id, ["hash-of-secret"]) == set()
    again = await new_agent(store, "discord:alice")
    assert await store.known_passage_hashes(again.id, ["hash-of-secret"]) == set()
