"""Forgetting what channels kept of a person leaves no trace, anywhere.

alice never talks to the bot: she speaks in #general, which listens. Her
lines are kept in the channel's memory (ChannelMemory.keep, as listening
keeps them: one on a topic, one not), embedded, and her listened message's
platform payload is in the inbox; a channel note is credited to her. bob
then asks the bot about her in #general: his recall holds a
conversation_search result quoting her line (appended as a search from the
channel records it) and his answer repeating it, which the outbox sent.
carol's line in the same channel is never touched.

Then alice forgets (everything; a topic, through the runtime and the CLI;
one item, her lines in #general; `/memory channels off`), and the storage
is scanned generically (tests/test_forget_scan.py's scans): on SQLite every
table of a copy of the data folder taken right after, and the raw bytes of
its files (the WAL too); on MongoDB every document of every collection. The
same scan before must find each of her words in the channel's memory, bob's
recall and the outbox (a blind scan cannot pass), and bob's own words and
carol's line survive.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pymongo import MongoClient

from bot.commands.catalog import press, run
from bot.commands.model import Caller
from bot.events import Delivery, UserMessage, agent_key
from bot.runtime import Runtime
from memory.channels import memory_key
from memory.embeddings import Embedder
from memory.mongo.store import MongoStore
from memory.places import Place
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from memory.types import Block, BlockLine, ChannelLine, Message, utc_now
from tests.conftest import make_settings
from tests.fake_llm import FakeLLMServer, Reply, reply_text, reply_tool_calls, tool_call
from tests.mongo_server import MongoTarget, mongo_target
from tests.test_cli import base_env, memgpt, ok
from tests.test_forget_scan import Needles, labels, mongo_hits, open_runtime, text_patterns
from tests.test_forget_scrubs_inbox import sqlite_copy_hits

__all__ = ["mongo_target"]

PLATFORM = "slack"
WORKSPACE = "T9"
GENERAL = Place("public", "C7", "#general")
CHANNEL = f"{PLATFORM}:{WORKSPACE}:{GENERAL.id}"
BACKENDS = ["sqlite", "mongodb"]


def word(stem: str) -> str:
    """One word no tokenizer splits nor stemmer shortens, unique to this run."""
    return f"{stem}{secrets.token_hex(6)}0"


@dataclass
class Member:
    name: str

    def __post_init__(self) -> None:
        self.user_id = f"{WORKSPACE}:U{secrets.token_hex(5).upper()}"
        self.topic = word(f"{self.name}topic")  # the code name: what she asks to forget
        self.secret = word(f"{self.name}secret")  # beside it, in the same line
        self.other = word(f"{self.name}other")  # in a line about something else
        self.noted = word(f"{self.name}noted")  # in the channel note credited to her
        self.event = f"Ev{secrets.token_hex(5)}"  # her listened message's id

    @property
    def key(self) -> str:
        return agent_key(PLATFORM, self.user_id)

    @property
    def line(self) -> str:
        return f"The launch moves to May third, its code name is {self.topic} and {self.secret} knows why."

    def needles(self, *kinds: str) -> Needles:
        return Needles({kind: text_patterns(getattr(self, kind)) for kind in kinds}, {})


def bob_model(alice: Member) -> Any:
    def answer(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return reply_text("(waiting)")
        return reply_tool_calls(tool_call("send_message", {"message": f"alice said: {alice.line}"}))

    return answer


async def keep(runtime: Runtime, who: Member, message_id: str, text: str) -> None:
    line = ChannelLine(CHANNEL, message_id, who.key, who.name, text, utc_now() - timedelta(hours=1), GENERAL.key)
    assert await runtime.channel_memory.keep(line)


async def listen(runtime: Runtime, alice: Member, carol: Member) -> None:
    """What #general keeps of alice (and of carol), as listening keeps it."""
    payload = {"type": "message", "channel": GENERAL.id, "user": alice.user_id, "text": alice.line}
    assert await runtime.receive(PLATFORM, alice.event, alice.user_id, payload)
    await keep(runtime, alice, alice.event, alice.line)
    await runtime.finished(alice.event)
    await keep(runtime, alice, "Ev-other", f"I went hiking near {alice.other} on Sunday.")
    await keep(runtime, carol, "Ev-carol", f"Carol here: the budget is {carol.topic} for the launch.")
    await runtime.channel_memory.settle(CHANNEL)
    memory = await runtime.store.find_agent(memory_key(CHANNEL))
    assert memory is not None
    # The channel's name, where its memory records it (its conversation for the place).
    await runtime.store.get_conversation(memory.id, GENERAL.key, GENERAL.name)
    note = BlockLine(f"Launch code name {alice.topic}, {alice.noted}.", GENERAL.key, speaker=alice.key)
    kept = BlockLine(f"Carol set the budget, {carol.noted}.", GENERAL.key, speaker=carol.key)
    await runtime.store.save_block(memory.id, Block("channel", limit=2000, lines=[note, kept]))


async def bob_asks(runtime: Runtime, llm: FakeLLMServer, alice: Member, bob: Member) -> None:
    """bob asks about alice in #general: a search quoting her line, and his answer repeating it, sent."""
    llm.set_handler(bob_model(alice))
    event = UserMessage(
        platform=PLATFORM, user_id=bob.user_id, text=f"What did alice say? I am {bob.topic}.", place=GENERAL
    )
    event.in_inbox, event.reply_to = True, {"channel": GENERAL.id}
    assert await runtime.receive(PLATFORM, event.event_id, bob.user_id, {"text": event.text, "user": bob.user_id})
    replies = await runtime.handle(event)
    assert [reply.text for reply in replies] == [f"alice said: {alice.line}"]
    for reply in replies:
        await runtime.report_delivery(reply, Delivery.SENT)
    await runtime.finished(event.event_id)
    record = await runtime.store.find_agent(bob.key)
    assert record is not None
    # A conversation_search from #general, as it records its hits: who said what, when.
    call = {
        "id": "call_s1",
        "type": "function",
        "function": {"name": "conversation_search", "arguments": json.dumps({"query": "launch"})},
    }
    hits = f"Page 0 of pages 0-0: results 1-1 of 1.\n- [2024-05-01 10:00] alice (in #general): {alice.line}"

    async def searched() -> None:
        await runtime.store.append_messages(
            record.id,
            [
                Message("assistant", None, tool_calls=[call], place=GENERAL.key),
                Message(
                    "tool",
                    json.dumps({"status": "OK", "result": hits}, ensure_ascii=False),
                    tool_call_id="call_s1",
                    name="conversation_search",
                    place=GENERAL.key,
                ),
            ],
        )

    await runtime.doors.admin(bob.key, searched)


@dataclass
class World:
    runtime: Runtime
    data: Path
    mongo: MongoTarget | None
    alice: Member
    bob: Member
    carol: Member
    scans: int = 0

    @property
    def store(self) -> Store:
        return self.runtime.store

    def hits(self, needles: Needles) -> set[str]:
        self.scans += 1
        if isinstance(self.store, SQLiteStore):
            return sqlite_copy_hits(self.data, self.data.parent / f"copy{self.scans}", needles)
        assert self.mongo is not None and isinstance(self.store, MongoStore)
        return mongo_hits(self.mongo.uri, self.store.database, needles)

    def embedding(self) -> bytes:
        """The stored embedding of alice's line, as bytes (float32)."""
        if isinstance(self.store, SQLiteStore):
            with sqlite3.connect(f"file:{self.store.path}?mode=ro", uri=True) as conn:
                (blob,) = conn.execute(
                    "SELECT embedding FROM messages WHERE speaker = ? AND event_id = ?",
                    (self.alice.key, self.alice.event),
                ).fetchone()
            return bytes(blob)
        assert self.mongo is not None and isinstance(self.store, MongoStore)
        client: MongoClient[dict[str, Any]] = MongoClient(self.mongo.uri, serverSelectionTimeoutMS=5000)
        try:
            db = client[self.store.database]
            line = db["messages"].find_one({"event_id": self.alice.event})
            assert line is not None
            doc = db["message_vectors"].find_one({"agent_id": line["agent_id"], "seq": line["seq"]})
        finally:
            client.close()
        assert doc is not None
        return np.asarray(doc["embedding"], dtype="<f4").tobytes()


def with_embedding(needles: Needles, blob: bytes) -> Needles:
    vector = np.frombuffer(blob, dtype="<f4")
    needles.patterns["embedding"] = [blob[:64], vector[:16].astype("<f2").tobytes()]
    needles.vectors["embedding"] = vector
    return needles


@asynccontextmanager
async def world(
    backend: str, tmp_path: Path, llm: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> AsyncIterator[World]:
    data = tmp_path / "data"
    mongo: MongoTarget | None = request.getfixturevalue("mongo_target") if backend == "mongodb" else None
    store: Store = mongo.store() if mongo is not None else SQLiteStore(data / "memgpt.sqlite3")
    runtime = await open_runtime(make_settings(data), store, llm, embedder)
    w = World(runtime, data, mongo, Member("alice"), Member("bob"), Member("carol"))
    try:
        await listen(runtime, w.alice, w.carol)
        await bob_asks(runtime, llm, w.alice, w.bob)
        yield w
    finally:
        await w.runtime.close(close_embedder=False)


def control(w: World, needles: Needles) -> None:
    """The scan sees each of alice's words before, in the channel's memory, bob's recall and the outbox."""
    before = w.hits(needles)
    assert labels(before) == set(needles.patterns), "the scan cannot see some of what alice left"
    where = {hit.rsplit(" in ", 1)[1] for hit in before if hit.startswith("'topic'") or hit.startswith("topic ")}
    for table in ("messages", "outbox", "event_journal"):
        assert any(table in place for place in where), f"the scenario left nothing of her topic in {table}"


def survivors(w: World) -> None:
    """bob's own words and carol's line and note are untouched."""
    kept = Needles(
        {
            "bob's words": text_patterns(w.bob.topic),
            "carol's line": text_patterns(w.carol.topic),
            "carol's note": text_patterns(w.carol.noted),
        },
        {},
    )
    assert labels(w.hits(kept)) == set(kept.patterns)


def left(w: World, needles: Needles) -> None:
    after = w.hits(needles)
    assert sorted(after) == [], "left behind:\n" + "\n".join(sorted(after))
    survivors(w)


ALL = ("topic", "secret", "other", "noted")
ON_TOPIC = ("topic", "secret", "noted")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_forget_everything_reaches_channel_memory_and_every_copy(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        alice = w.alice
        needles = with_embedding(alice.needles(*ALL), w.embedding())
        needles.patterns["agent key"] = text_patterns(alice.key)
        needles.patterns["user id"] = text_patterns(alice.user_id)
        control(w, needles)
        assert (await press(w.runtime, "forget_confirm", Caller(PLATFORM, alice.user_id), "")).text.startswith(
            "Done: I have forgotten everything"
        )
        left(w, needles)
        assert await w.runtime.channel_memory.speaker_counts(alice.key) == {}
        assert await w.runtime.channel_memory.consent([alice.key]) == {}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_forget_a_topic_reaches_her_lines_notes_and_their_copies(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        alice = w.alice
        needles = with_embedding(alice.needles(*ON_TOPIC), w.embedding())
        control(w, needles)
        caller = Caller(PLATFORM, alice.user_id)
        preview = (await run(w.runtime, "forget", caller, {"about": alice.topic})).text
        assert f"About {alice.topic!r} I hold 1 message kept by a channel, 1 channel note credited to you:" in preview
        assert alice.secret in preview and alice.noted in preview and alice.other not in preview
        done = (await press(w.runtime, "forget_about", caller, alice.topic)).text
        assert "from channel memories, 1 message of yours and 1 note credited to you" in done
        left(w, needles)
        # Her other line stays in the channel's memory.
        assert [line.text for line in await w.runtime.channel_memory.speaker_lines(alice.key)] == [
            f"I went hiking near {alice.other} on Sunday."
        ]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_cli_forget_about_a_topic_goes_the_same_way(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        alice = w.alice
        needles = alice.needles(*ON_TOPIC)
        control(w, needles)
        env = base_env(llm_server.base_url, w.data)
        if isinstance(w.store, MongoStore):
            assert w.mongo is not None
            env |= {"MONGODB_URI": w.mongo.uri, "MONGODB_DB": w.store.database}
        else:
            await w.runtime.close(close_embedder=False)  # the bot stopped, as an operator would
        args = ("memory", "forget", "--user", f"{PLATFORM}:{alice.user_id}", "--about", alice.topic, "--yes")
        said = ok(memgpt(*args, env=env, cwd=tmp_path))
        assert "1 message kept by a channel" in said and "1 message of yours and 1 note credited to you" in said
        if isinstance(w.store, SQLiteStore):
            w.runtime = await open_runtime(make_settings(w.data), SQLiteStore(w.store.path), llm_server, embedder)
        log = Needles(needles.patterns, {})
        after = {hit for hit in w.hits(log) if "memgpt-bot.log" not in hit}  # the CLI's log: whom it forgot
        assert sorted(after) == [], "left behind:\n" + "\n".join(sorted(after))
        survivors(w)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_forget_one_channel_item(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        alice = w.alice
        needles = with_embedding(alice.needles(*ALL), w.embedding())
        control(w, needles)
        caller = Caller(PLATFORM, alice.user_id)
        ledger = await run(w.runtime, "memory", caller, {})
        [entry] = ledger.entries
        held = "2 messages of yours and 1 note credited to you"
        assert entry.text == f"1. Channel memory: {held} (kept by channel #general) [channel:{CHANNEL}]"
        [button] = entry.buttons
        assert (button.action, button.value) == ("forget_item", f"channel:{CHANNEL}")
        done = (await press(w.runtime, "forget_item", caller, button.value)).text
        assert held in done
        left(w, needles)
        assert (await run(w.runtime, "memory", caller, {})).text == "I hold nothing on you."


@pytest.mark.parametrize("backend", BACKENDS)
async def test_memory_channels_off_stops_and_deletes_and_on_turns_it_back(
    backend: str, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder, request: pytest.FixtureRequest
) -> None:
    async with world(backend, tmp_path, llm_server, embedder, request) as w:
        alice, memory = w.alice, w.runtime.channel_memory
        needles = with_embedding(alice.needles(*ALL), w.embedding())
        control(w, needles)
        caller = Caller(PLATFORM, alice.user_id)
        shown = (await run(w.runtime, "memory", caller, {"channels": "show"})).text
        assert shown.startswith("Channel memory is on")
        assert "#general: 2 messages of yours and 1 note credited to you" in shown
        said = (await run(w.runtime, "memory", caller, {"channels": "off"})).text
        assert said.startswith("Done: channels no longer keep what you say")
        assert "2 messages and 1 note credited to you" in said
        left(w, needles)
        # Off: a line she says now is not kept; her choice is all the store holds of her.
        assert await memory.consent([alice.key]) == {alice.key: False}
        line = ChannelLine(CHANNEL, "Ev-later", alice.key, "alice", "later", utc_now(), GENERAL.key)
        assert not await memory.keep_with_consent(line)
        assert (await run(w.runtime, "memory", caller, {"channels": ""})).text.startswith("Channel memory is off")
        assert (await run(w.runtime, "memory", caller, {"channels": "on"})).text.startswith("Done: channels where")
        assert await memory.keep_with_consent(line)
        assert await memory.speaker_counts(alice.key) == {CHANNEL: 1}
