"""MongoDB-specific behaviour of MongoStore, against a real wire-protocol
server: FerretDB (built and started by tests/mongo_server.py) or the MongoDB
named by MONGODB_TEST_URI. The shared behaviour is in tests/conformance."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

import pytest
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError

from memory.mongo.capabilities import IN_PROCESS_VECTORS, RECALL_SEARCH, redact_uri, scrub, store_error
from memory.mongo.indexes import ALL_INDEXES
from memory.mongo.store import MongoStore, bm25, words
from memory.store import StoreError
from memory.types import Block, Message, Passage
from tests.helpers import free_port
from tests.mongo_server import MongoTarget, mongo_store, mongo_target, mongo_twin

__all__ = ["mongo_store", "mongo_target", "mongo_twin"]  # the fixtures, imported to be found here

BLOCKS = [Block("persona", "helpful", 100), Block("human", "unknown", 100)]


@pytest.fixture
def store(mongo_store: MongoStore) -> MongoStore:
    return mongo_store


@pytest.fixture
def twin(mongo_twin: MongoStore) -> MongoStore:
    """A second store on the same database with its own client: another process."""
    return mongo_twin


# -- capabilities and the paths they choose ----------------------------------
async def test_capabilities_pick_the_fallbacks_on_ferretdb(
    mongo_target: MongoTarget, caplog: pytest.LogCaptureFixture
) -> None:
    if not mongo_target.is_ferretdb:
        pytest.skip("FerretDB-specific: MONGODB_TEST_URI names another server")
    backend = mongo_target.store()
    with caplog.at_level(logging.INFO, logger="memory.mongo.store"):
        await backend.open()
    try:
        caps = backend.capabilities
        assert caps is not None
        assert caps.ferretdb and caps.server.startswith("FerretDB v1.24")
        assert caps.topology == "standalone" and not caps.transactions
        assert not caps.text_index and not caps.vector_search
        assert (caps.recall_search, caps.archival_search) == (RECALL_SEARCH, IN_PROCESS_VECTORS)
        assert "transactions: no" in caplog.text and "archival search: in-process VectorIndex" in caplog.text
    finally:
        await backend.close()


async def test_capabilities_of_a_real_mongodb(store: MongoStore) -> None:
    caps = store.capabilities
    assert caps is not None
    if caps.ferretdb:
        pytest.skip("for MONGODB_TEST_URI: FerretDB is covered above")
    assert caps.server.startswith("MongoDB ") and caps.transactions == (caps.topology != "standalone")


async def test_searches_take_the_in_process_and_bm25_paths(store: MongoStore) -> None:
    caps = store.capabilities
    assert caps is not None and caps.archival_search == IN_PROCESS_VECTORS  # no vector index was named
    agent, _ = await store.get_or_create_agent("discord:alice", BLOCKS)
    ids = await store.insert_passages(agent.id, [Passage("north", embedding=[1.0, 0.0]), Passage("east")])
    assert agent.id not in store._indexes
    page = await store.search_passages(agent.id, "", [1.0, 0.1], 5)
    assert [p.id for p, _ in page.items] == [ids[0]]
    index, _version = store._indexes[agent.id]  # the in-process VectorIndex answered
    assert len(index) == 1 and ids[0] in index

    await store.append_messages(agent.id, [Message("user", "the Zoo is CLOSED"), Message("user", "zoos")])
    raw = await store._c("messages").find_one({"agent_id": agent.id, "seq": 1})
    assert raw is not None and raw["terms"] == ["closed", "is", "the", "zoo"]  # what the terms index holds
    page = await store.search_messages(agent.id, "zoo", 5)  # stemmed, as conversation search ranks
    assert sorted(m.content for m in page.items) == ["the Zoo is CLOSED", "zoos"]
    page = await store.search_messages(agent.id, "the is", 5)  # stop words only: the terms index
    assert [m.content for m in page.items] == ["the Zoo is CLOSED"]


async def test_indexes_exist_after_open_and_open_twice_is_harmless(store: MongoStore, twin: MongoStore) -> None:
    await store.open()  # the same instance again: nothing happens
    await twin.open()  # a second client on the same database: same indexes, no error
    for name, models in ALL_INDEXES.items():
        info = await store._c(name).index_information()
        for model in models:
            spec = model.document
            assert spec["name"] in info, (name, spec["name"])
            assert list(info[spec["name"]]["key"]) == list(spec["key"].items())
            assert bool(info[spec["name"]].get("unique")) == bool(spec.get("unique")), spec["name"]
    agent, _ = await twin.get_or_create_agent("slack:T1:U1", BLOCKS)
    assert (await store.find_agent("slack:T1:U1")) == agent


# -- errors ----------------------------------------------------------------------
async def test_unreachable_server_is_a_quick_store_error_without_the_password() -> None:
    uri = f"mongodb://alice:s3cret-Pa55@127.0.0.1:{free_port()}/?authSource=admin"
    backend = MongoStore(uri, "memgpt", server_selection_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        await backend.open()
    assert time.monotonic() - started < 5
    text = str(caught.value)
    assert "unreachable" in text and "alice:***@127.0.0.1" in text
    assert "s3cret" not in text and "s3cret" not in repr(backend)
    with pytest.raises(StoreError, match="not open"):
        await backend.count_messages("anyone")


def test_error_texts_name_the_problem_and_never_the_password() -> None:
    uri = "mongodb://bot:p%40ss@w0rd@db1:27017,db2:27017/memgpt?replicaSet=rs0"
    assert redact_uri(uri) == "mongodb://bot:***@db1:27017,db2:27017/memgpt?replicaSet=rs0"
    assert redact_uri("mongodb+srv://reader@cluster0.example.net/") == "mongodb+srv://reader@cluster0.example.net/"
    assert redact_uri("mongodb://localhost/") == "mongodb://localhost/"
    assert scrub("login p%40ss@w0rd / p@ss@w0rd failed", uri) == "login *** / *** failed"

    full = OperationFailure("Write failed: No space left on device", code=14031)
    assert "out of disk space" in str(store_error(uri, "memgpt", "append_messages", full))
    denied = OperationFailure("Authentication failed.", code=18)
    assert "authentication failed" in str(store_error(uri, "memgpt", "open", denied))
    down = ServerSelectionTimeoutError("db1:27017: timed out, Timeout: 0.5s, Topology Description: <...>")
    text = str(store_error(uri, "memgpt", "open", down))
    assert (
        text == "MongoDB mongodb://bot:***@db1:27017,db2:27017/memgpt?replicaSet=rs0 (database 'memgpt') "
        "is unreachable: db1:27017: timed out"
    )


async def test_writes_for_a_missing_agent_are_refused(store: MongoStore) -> None:
    for call in (
        store.append_messages("ghost", [Message("user", "boo")]),
        store.insert_passages("ghost", [Passage("boo")]),
        store.save_block("ghost", Block("notes", "", 10)),
        store.update_queue("ghost", "", 1, datetime.now(UTC)),
    ):
        with pytest.raises(StoreError, match="no agent"):
            await call
    assert await store._c("messages").count_documents({}) == 0
    assert await store._c("passages").count_documents({}) == 0


# -- several processes ---------------------------------------------------------
async def test_two_clients_appending_to_one_agent_get_unique_gap_free_seqs(store: MongoStore, twin: MongoStore) -> None:
    agent, _ = await store.get_or_create_agent("discord:busy", BLOCKS)

    async def append(backend: MongoStore, n: int) -> list[Message]:
        return await backend.append_messages(agent.id, [Message("user", f"{n} a"), Message("assistant", f"{n} b")])

    results = await asyncio.gather(*(append(store if n % 2 else twin, n) for n in range(60)))
    assert sorted(m.seq for pair in results for m in pair) == list(range(1, 121))
    for pair in results:  # each batch stays whole and in order
        assert pair[1].seq == pair[0].seq + 1 and (pair[0].content or "").endswith(" a")
    assert [m.seq for m in await twin.messages_since(agent.id, 0)] == list(range(1, 121))
    assert await store.count_messages(agent.id) == 120


async def test_two_clients_inserting_passages_get_unique_ids(store: MongoStore, twin: MongoStore) -> None:
    # FerretDB runs $inc as read-then-write, so the two clients' id reservations
    # collide: the unique _id makes the loser take its batch back and retry.
    agent, _ = await store.get_or_create_agent("discord:loader", BLOCKS)

    async def insert(backend: MongoStore, n: int) -> list[int]:
        return await backend.insert_passages(agent.id, [Passage(f"{n}.{k}") for k in range(3)])

    results = await asyncio.gather(*(insert(store if n % 2 else twin, n) for n in range(30)))
    ids = [i for batch in results for i in batch]
    assert len(set(ids)) == 90 and await store.count_passages(agent.id) == 90
    stored = {p.id: p.text for p in await store.list_passages(agent.id, 100)}
    for n, batch in enumerate(results):
        assert [stored[i] for i in batch] == [f"{n}.{k}" for k in range(3)]


async def test_vector_index_follows_changes_made_by_another_client(store: MongoStore, twin: MongoStore) -> None:
    agent, _ = await store.get_or_create_agent("discord:shared", BLOCKS)
    [first] = await store.insert_passages(agent.id, [Passage("first", embedding=[1.0, 0.0])])
    assert (await store.search_passages(agent.id, "", [1.0, 0.0], 5)).total == 1  # cached here now
    [second] = await twin.insert_passages(agent.id, [Passage("second", embedding=[0.9, 0.1])])
    page = await store.search_passages(agent.id, "", [1.0, 0.0], 5)
    assert [p.id for p, _ in page.items] == [first, second]
    await twin.set_embeddings(agent.id, {first: [0.0, 1.0]})
    await twin.delete_passages(agent.id, [second])
    page = await store.search_passages(agent.id, "", [1.0, 0.0], 5)
    assert [(p.id, round(score, 5)) for p, score in page.items] == [(first, 0.0)]


# -- crashes ---------------------------------------------------------------------
async def test_a_crash_gap_in_seqs_breaks_nothing(store: MongoStore) -> None:
    agent, _ = await store.get_or_create_agent("discord:crashy", BLOCKS)
    await store.append_messages(agent.id, [Message("user", "before")])
    # A batch of three whose process died after its first message went in.
    await store._c("messages").insert_one(
        {
            "agent_id": agent.id,
            "seq": 2,
            "batch_end": 4,
            "tok_total": 2,
            "role": "user",
            "content": "half",
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
            "created_at": 0,
            "terms": ["half"],
        }
    )
    [after] = await store.append_messages(agent.id, [Message("user", "after the crash")])
    assert after.seq == 5
    assert [(m.seq, m.content) for m in await store.messages_since(agent.id, 0)] == [
        (1, "before"),
        (2, "half"),
        (5, "after the crash"),
    ]
    assert await store.count_messages(agent.id) == 3
    assert [m.seq for m in await store.messages_since(agent.id, 3)] == [5]
    assert [m.content for m in (await store.search_messages(agent.id, "crash half", 5)).items] == [
        "half",
        "after the crash",
    ]


async def test_open_finishes_an_interrupted_delete(store: MongoStore, mongo_target: MongoTarget) -> None:
    doomed, _ = await store.get_or_create_agent("discord:doomed", BLOCKS)
    kept, _ = await store.get_or_create_agent("discord:kept", BLOCKS)
    for agent in (doomed, kept):
        await store.append_messages(agent.id, [Message("user", "secret")])
        await store.insert_passages(agent.id, [Passage("secret", embedding=[1.0])])
    # The process died right after writing the tombstone.
    await store._c("agents").update_one({"_id": doomed.id}, {"$set": {"deleting": True, "key": "#deleted:x"}})
    assert await store.find_agent("discord:doomed") is None
    assert [a.id for a in await store.list_agents()] == [kept.id]

    restarted = MongoStore(mongo_target.uri, store.database)
    await restarted.open()
    try:
        for name in ("agents", "blocks", "messages", "passages"):
            field = "_id" if name == "agents" else "agent_id"
            assert await restarted._c(name).count_documents({field: doomed.id}) == 0, name
        assert await restarted.count_messages(kept.id) == 1
    finally:
        await restarted.close()


async def test_an_agent_created_without_its_blocks_gets_them_next_time(store: MongoStore) -> None:
    # The process died between the agent document and its default blocks.
    await store._c("agents").insert_one(
        {
            "_id": "half-made",
            "key": "discord:half",
            "created_at": 1,
            "ready": False,
        }
    )
    agent, blocks = await store.get_or_create_agent("discord:half", BLOCKS)
    assert agent.id == "half-made" and [b.label for b in blocks] == ["persona", "human"]
    again, blocks = await store.get_or_create_agent("discord:half", [Block("other", "", 1)])
    assert again == agent and [b.label for b in blocks] == ["persona", "human"]


# -- values ----------------------------------------------------------------------
async def test_naive_times_are_utc_and_microseconds_survive(store: MongoStore) -> None:
    agent, _ = await store.get_or_create_agent("discord:clock", BLOCKS)
    naive = datetime(1969, 7, 20, 20, 17, 40, 999999)  # before the epoch, too
    await store.append_messages(agent.id, [Message("user", "one small step", created_at=naive)])
    [message] = await store.messages_since(agent.id, 0)
    assert message.created_at == naive.replace(tzinfo=UTC)


def test_words_fold_case_and_accents_and_bm25_prefers_rare_words() -> None:
    assert words("Café NOIR, straße İstanbul ﬁle") == ["cafe", "noir", "strasse", "istanbul", "file"]
    assert words("x" * 100) == ["x" * 64]
    docs = [["today", "sun"], ["today", "rain"], ["today"], ["zoo", "was", "closed", "today", "night", "storm"]]
    scores = bm25(docs, ["today", "zoo"], n_docs=10, avg_len=3.0)
    assert max(range(4), key=scores.__getitem__) == 3
    assert bm25([["a"], ["b"]], ["c"], 2, 1.0) == [0.0, 0.0]


async def test_hundreds_of_embeddings_are_stored_in_bulk_writes_the_server_answers(store: MongoStore) -> None:
    # FerretDB never answered one bulk write of 256 updates (recall's embedding
    # batch): they go by _id, WRITE_BATCH at a time. Without that this waits forever.
    agent, _ = await store.get_or_create_agent("discord:many", BLOCKS)
    await store.append_messages(agent.id, [Message("user", f"turn {n}") for n in range(300)])
    ids = await store.insert_passages(agent.id, [Passage(f"fact {n}") for n in range(300)])
    vectors = {n: [1.0, float(n)] for n in range(1, 301)}
    await asyncio.wait_for(store.set_message_embeddings(agent.id, vectors), 120)
    await asyncio.wait_for(store.set_embeddings(agent.id, dict(zip(ids, vectors.values(), strict=True))), 120)
    assert await store.messages_without_embedding(agent.id, 10) == []
    assert await store.passages_without_embedding(agent.id) == []
    # Another agent's seqs and ids are not written.
    other, _ = await store.get_or_create_agent("discord:other", BLOCKS)
    await store.append_messages(other.id, [Message("user", "mine")])
    await store.set_message_embeddings(agent.id, {1: [0.0, 1.0]})
    assert [m.seq for m in await store.messages_without_embedding(other.id, 10)] == [1]
