"""Recall's message embeddings on MongoDB live in `message_vectors`, apart
from the messages (memory/mongo/vectors.py says why): the messages hold none,
a vector goes with its message, and a database of the older layout (the
embedding inside each message) is moved over at open, once."""

from __future__ import annotations

import logging

import pytest

from memory.mongo.store import MongoStore
from memory.mongo.vectors import VECTORS, vector_id
from memory.types import Block, Message
from tests.mongo_server import MongoTarget, mongo_store, mongo_target

__all__ = ["mongo_store", "mongo_target"]  # the fixtures, imported to be found here

BLOCKS = [Block("human", "", 100)]


async def test_embeddings_are_stored_apart_and_go_with_their_messages(mongo_store: MongoStore) -> None:
    store = mongo_store
    agent, _ = await store.get_or_create_agent("discord:alice", BLOCKS)
    await store.append_messages(agent.id, [Message("user", word) for word in ("north", "east", "south")])
    await store.set_message_embeddings(agent.id, {1: [1.0, 0.0], 2: [0.0, 1.0], 3: [0.7, 0.7]})
    assert await store.messages_without_embedding(agent.id, 10) == []
    assert await store._c("messages").count_documents({"embedding": {"$exists": True}}) == 0
    assert {doc["_id"] async for doc in store._c(VECTORS).find({})} == {vector_id(agent.id, n) for n in (1, 2, 3)}
    page = await store.search_messages(agent.id, "north", 1, query_vector=[1.0, 0.0])
    assert [m.content for m in page.items] == ["north"]

    await store.delete_messages(agent.id, [2])
    assert {doc["seq"] async for doc in store._c(VECTORS).find({})} == {1, 3}
    await store.delete_agent(agent.id)
    assert await store._c(VECTORS).count_documents({}) == 0


async def test_embeddings_inside_messages_are_moved_out_at_open(
    mongo_target: MongoTarget, caplog: pytest.LogCaptureFixture
) -> None:
    first = mongo_target.store()
    await first.open()
    try:
        agent, _ = await first.get_or_create_agent("discord:bob", BLOCKS)
        await first.append_messages(agent.id, [Message("user", "the harbour bridge"), Message("user", "winter")])
        # The older layout: the vector inside the message, no `embedded` mark.
        await first._c("messages").update_one({"agent_id": agent.id, "seq": 1}, {"$set": {"embedding": [1.0, 0.0]}})
        caplog.set_level(logging.INFO)
        for run in range(2):  # idempotent: a second open moves nothing
            caplog.clear()
            store = mongo_target.reopened(first.database)
            await store.open()
            try:
                moved = [r.getMessage() for r in caplog.records if "moved the embeddings" in r.getMessage()]
                assert moved == (["moved the embeddings of 1 recall messages to message_vectors"] if run == 0 else [])
                doc = await store._c("messages").find_one({"agent_id": agent.id, "seq": 1})
                assert doc is not None and "embedding" not in doc and doc["embedded"] is True
                vector = await store._c(VECTORS).find_one({"_id": vector_id(agent.id, 1)})
                assert vector is not None and vector["embedding"] == [1.0, 0.0]
                assert [m.seq for m in await store.messages_without_embedding(agent.id, 10)] == [2]
                page = await store.search_messages(agent.id, "anything", 1, query_vector=[1.0, 0.0])
                assert [m.content for m in page.items] == ["the harbour bridge"]
            finally:
                await store.close()
    finally:
        await first.close()
