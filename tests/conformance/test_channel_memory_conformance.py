"""Channel memory (memory/channels.py) on every Store backend: lines kept once,
edited and deleted as the platform says, searched in their channel only, each
hit with its speaker and time; a speaker's lines counted, listed and deleted
leaving no copy (the scans of tests/test_forget_scan.py), retention, consent,
and a restart. The embedder is the real one: embedding is part of the path."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from memory.channels import ChannelMemory, channel_key, memory_key
from memory.embeddings import Embedder
from memory.mongo.store import MongoStore
from memory.places import Place
from memory.recall import RecallMemory
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from memory.types import ChannelLine, Message, is_person_key
from tests.conformance.test_store_conformance import new_agent
from tests.mongo_server import shared_target
from tests.test_forget_scan import Needles, file_hits, mongo_hits, sqlite_hits, text_patterns

GENERAL = "slack:T01:C01"
RANDOM = "slack:T01:C02"
ELSEWHERE = "slack:T99:C01"  # the same channel id in another workspace
ALICE, BOB = "slack:T01:U0A", "slack:T01:U0B"
T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


@dataclass
class Said:
    """Lines are numbered per test, so message ids never collide within a channel."""

    count: int = 0

    def line(
        self, channel: str, speaker: str, text: str, *, at: datetime | None = None, message_id: str = ""
    ) -> ChannelLine:
        self.count += 1
        name = "alice" if speaker == ALICE else "bob"
        when = at or T0 + timedelta(minutes=self.count)
        return ChannelLine(channel, message_id or f"m{self.count}", speaker, name, text, when, "public:C01")


@pytest.fixture
async def channels(store: Store, embedder: Embedder) -> AsyncIterator[ChannelMemory]:
    recall = RecallMemory(store, embedder)
    yield ChannelMemory(store, recall)
    await recall.close()


async def keep_all(channels: ChannelMemory, lines: Sequence[ChannelLine]) -> None:
    for line in lines:
        assert await channels.keep(line)
    for channel in {line.channel for line in lines}:
        await channels.settle(channel)


def texts(page_items: Sequence[ChannelLine]) -> list[str]:
    return [line.text for line in page_items]


def test_a_channel_key_holds_platform_workspace_and_channel_and_a_thread_is_its_channels() -> None:
    assert channel_key("slack", "T01", Place("public", "C01")) == GENERAL
    assert channel_key("slack", "T01", Place("private", "C01", thread="170.5")) == GENERAL
    assert channel_key("discord", "G7", Place("public", "C01")) == "discord:G7:C01"
    with pytest.raises(ValueError, match="direct message"):
        channel_key("slack", "T01", Place())
    assert not is_person_key(memory_key(GENERAL))
    assert is_person_key(ALICE)


async def test_a_line_is_kept_exactly_once_however_often_it_is_offered(
    store: Store, channels: ChannelMemory, twin: Store, embedder: Embedder
) -> None:
    said = Said()
    line = said.line(GENERAL, ALICE, "the launch moves to June")
    assert await channels.keep(line)
    assert not await channels.keep(said.line(GENERAL, ALICE, line.text, message_id="m1"))  # a re-delivery
    # Offered at once, many times, in this process and in another one.
    again = said.line(GENERAL, BOB, "re-delivered five times", message_id="m9")
    other = ChannelMemory(twin, RecallMemory(twin, embedder))
    results = await asyncio.gather(*(channels.keep(again) for _ in range(3)), *(other.keep(again) for _ in range(2)))
    assert sorted(results) == [False, False, False, False, True]
    record = await store.find_agent(memory_key(GENERAL))
    assert record is not None
    assert await store.count_messages(record.id) == 2
    await channels.settle(GENERAL)
    await other.recall.close()


async def test_keeping_never_waits_for_the_embedder(store: Store, embedder: Embedder) -> None:
    gate = asyncio.Event()

    class Gated(Embedder):
        async def embed(self, texts: Sequence[str]) -> np.ndarray:
            await gate.wait()
            return await embedder.embed(texts)

    recall = RecallMemory(store, Gated())
    channels = ChannelMemory(store, recall)
    said = Said()
    for n in range(5):
        assert await asyncio.wait_for(channels.keep(said.line(GENERAL, ALICE, f"line {n} kept")), 10)
    record = await store.find_agent(memory_key(GENERAL))
    assert record is not None
    assert len(await store.messages_without_embedding(record.id, 10)) == 5
    gate.set()
    await channels.settle(GENERAL)
    assert await store.messages_without_embedding(record.id, 10) == []  # all embedded, in the background
    await recall.close()


async def test_search_finds_the_channels_lines_only_each_with_speaker_and_time(channels: ChannelMemory) -> None:
    said = Said()
    await keep_all(
        channels,
        [
            said.line(GENERAL, ALICE, "the launch of Bluefin moves to the ninth of June"),
            said.line(GENERAL, BOB, "noted, I will tell marketing"),
            said.line(RANDOM, ALICE, "Bluefin is also the name of my boat"),
            said.line(ELSEWHERE, BOB, "Bluefin launch cancelled in the other workspace"),
        ],
    )
    page = await channels.search(GENERAL, "when is the Bluefin launch?", 10)
    assert texts(page.items)[0] == "the launch of Bluefin moves to the ninth of June"
    assert {line.channel for line in page.items} == {GENERAL}
    assert "Bluefin is also the name of my boat" not in texts(page.items)
    assert "Bluefin launch cancelled in the other workspace" not in texts(page.items)
    first = page.items[0]
    assert (first.speaker, first.speaker_name, first.message_id) == (ALICE, "alice", "m1")
    assert first.said_at == T0 + timedelta(minutes=1)
    assert first.place == "public:C01" and first.seq > 0
    # The speaker signal: a question about one person ranks their line first.
    assert (await channels.search(GENERAL, "what did bob say?", 1)).items[0].speaker == BOB
    # A channel nobody spoke in has no memory.
    assert (await channels.search("slack:T01:C77", "Bluefin", 10)).items == []


async def test_an_edit_replaces_the_text_and_a_deletion_removes_the_line(channels: ChannelMemory) -> None:
    said = Said()
    await keep_all(
        channels,
        [said.line(GENERAL, ALICE, "the code name is Marlin"), said.line(GENERAL, BOB, "the budget is 40k")],
    )
    edited_at = T0 + timedelta(hours=2)
    assert await channels.edit(GENERAL, "m1", "the code name is Sailfish", edited_at)
    assert not await channels.edit(GENERAL, "m404", "nothing here", edited_at)
    await channels.settle(GENERAL)
    hits = (await channels.search(GENERAL, "Sailfish", 10)).items
    assert texts(hits)[0] == "the code name is Sailfish"
    assert hits[0].edited_at == edited_at and hits[0].said_at == T0 + timedelta(minutes=1)
    assert "the code name is Marlin" not in texts((await channels.search(GENERAL, "Marlin", 10)).items)

    assert await channels.delete(GENERAL, "m2")
    assert not await channels.delete(GENERAL, "m2")
    assert "the budget is 40k" not in texts((await channels.search(GENERAL, "budget", 10)).items)
    assert await channels.speaker_counts(BOB) == {}


async def test_an_edit_or_deletion_applies_where_another_process_kept_the_line(
    store: Store, embedder: Embedder, channels: ChannelMemory
) -> None:
    # This process found the channel without a memory (and remembers that for a while);
    # another kept a line there since: the platform's edit and deletion of it still apply.
    other_recall = RecallMemory(store, embedder)
    other = ChannelMemory(store, other_recall)
    try:
        assert (await channels.search(GENERAL, "Marlin", 10)).total == 0
        said = Said()
        await keep_all(other, [said.line(GENERAL, ALICE, "the code name is Marlin")])
        assert await channels.edit(GENERAL, "m1", "the code name is Sailfish", T0 + timedelta(hours=1))
        assert await channels.delete(GENERAL, "m1")
        assert await other.speaker_counts(ALICE) == {}
    finally:
        await other_recall.close()


async def test_a_speakers_lines_are_counted_listed_and_forgotten_by_channel_or_topic(
    store: Store, channels: ChannelMemory
) -> None:
    said = Said()
    await keep_all(
        channels,
        [
            said.line(GENERAL, ALICE, "my sister lives in Lisbon"),
            said.line(GENERAL, ALICE, "the deploy is on Friday"),
            said.line(GENERAL, BOB, "my sister lives in Oslo"),
            said.line(RANDOM, ALICE, "Lisbon has good coffee"),
        ],
    )
    person = await new_agent(store, ALICE)  # her own memory: not a channel's
    await store.append_messages(person.id, [Message("user", "Lisbon again", speaker=ALICE, speaker_name="alice")])
    assert await channels.speaker_counts(ALICE) == {GENERAL: 2, RANDOM: 1}
    lines = await channels.speaker_lines(ALICE)
    assert [(line.channel, line.text) for line in lines] == [
        (GENERAL, "my sister lives in Lisbon"),
        (GENERAL, "the deploy is on Friday"),
        (RANDOM, "Lisbon has good coffee"),
    ]
    assert texts(await channels.speaker_lines(ALICE, RANDOM)) == ["Lisbon has good coffee"]
    # About a topic: the caller matches her lines (bot/forgetting), then deletes those.
    assert await channels.forget_lines([line for line in lines if "Lisbon" in line.text]) == 2
    assert await channels.speaker_counts(ALICE) == {GENERAL: 1}
    found = texts((await channels.search(GENERAL, "sister Lisbon", 10)).items)
    assert found[0] == "my sister lives in Oslo" and "my sister lives in Lisbon" not in found
    # In one channel, then everywhere; bob's lines stay.
    await channels.keep(said.line(RANDOM, ALICE, "one more in random"))
    assert await channels.forget_speaker(ALICE, GENERAL) == 1
    assert await channels.speaker_counts(ALICE) == {RANDOM: 1}
    assert await channels.forget_speaker(ALICE) == 1
    assert await channels.speaker_counts(ALICE) == {}
    assert await channels.speaker_counts(BOB) == {GENERAL: 1}
    assert await store.count_messages(person.id) == 1  # what is not a channel's memory is not touched


async def test_retention_prunes_old_lines_of_every_channel_and_nothing_else(
    store: Store, channels: ChannelMemory
) -> None:
    said = Said()
    now = T0 + timedelta(days=100)
    await keep_all(
        channels,
        [
            said.line(GENERAL, ALICE, "an old line", at=now - timedelta(days=40)),
            said.line(RANDOM, BOB, "another old line", at=now - timedelta(days=31)),
            said.line(GENERAL, BOB, "a recent line", at=now - timedelta(days=29)),
        ],
    )
    person = await new_agent(store, ALICE)
    await store.append_messages(person.id, [Message("user", "her own old words", created_at=now - timedelta(days=90))])
    assert await channels.prune(timedelta(days=30), now=now) == 2
    assert await channels.speaker_counts(ALICE) == {}
    assert await channels.speaker_counts(BOB) == {GENERAL: 1}
    assert texts((await channels.search(GENERAL, "line", 10)).items) == ["a recent line"]
    assert await store.count_messages(person.id) == 1
    assert await channels.prune(timedelta(days=30), now=now) == 0


async def test_consent_is_recorded_per_speaker_and_read_in_bulk(channels: ChannelMemory) -> None:
    assert await channels.consent([ALICE, BOB]) == {}
    await channels.set_consent(ALICE, False)
    await channels.set_consent(BOB, True)
    await channels.set_consent(BOB, False)
    assert await channels.consent([ALICE, BOB, "slack:T01:U0C"]) == {ALICE: False, BOB: False}
    await channels.set_consent(ALICE, True)
    await channels.set_consent(BOB, None)  # back to the deployment's default
    assert await channels.consent([ALICE, BOB]) == {ALICE: True}
    assert await channels.consent([]) == {}


async def reopened(store: Store) -> Store:
    if isinstance(store, SQLiteStore):
        return SQLiteStore(store.path)
    if isinstance(store, MongoStore):
        return shared_target().reopened(store.database)
    pytest.skip(f"no reopening {type(store).__name__}")


async def test_search_after_a_restart(store: Store, channels: ChannelMemory, embedder: Embedder) -> None:
    said = Said()
    await keep_all(channels, [said.line(GENERAL, ALICE, "the offsite is in Porto"), said.line(GENERAL, BOB, "ok")])
    again = await reopened(store)
    await again.open()
    try:
        recall = RecallMemory(again, embedder)
        hits = (await ChannelMemory(again, recall).search(GENERAL, "where is the offsite?", 5)).items
        assert hits[0].text == "the offsite is in Porto"
        assert (hits[0].speaker, hits[0].speaker_name) == (ALICE, "alice")
        await recall.close()
    finally:
        await again.close()


# -- forgetting a speaker leaves no copy ---------------------------------------------
def hits_in(store: Store, folder: Path, needles: Needles) -> set[str]:
    if isinstance(store, SQLiteStore):
        return sqlite_hits(store.path, needles) | file_hits(folder, needles)
    assert isinstance(store, MongoStore)
    return mongo_hits(shared_target().uri, store.database, needles)


async def test_forgetting_a_speaker_leaves_no_line_index_entry_or_embedding(
    store: Store, channels: ChannelMemory, tmp_path: Path
) -> None:
    secret, kept = f"zephyr{secrets.token_hex(6)}", f"quokka{secrets.token_hex(6)}"
    said = Said()
    await keep_all(
        channels,
        [
            said.line(GENERAL, ALICE, f"my password hint is {secret}"),
            said.line(RANDOM, ALICE, f"{secret} again, elsewhere"),
            said.line(GENERAL, BOB, f"bob says {kept}"),
        ],
    )
    await channels.edit(GENERAL, "m1", f"my password hint is {secret}, edited", T0 + timedelta(hours=1))
    await channels.settle(GENERAL)
    record = await store.find_agent(memory_key(RANDOM))
    assert record is not None
    vector = await _vector_of(store, record.id, f"{secret} again, elsewhere")
    as_floats = np.frombuffer(vector, dtype="<f4")
    needles = Needles(
        {"her words": text_patterns(secret), "her key": text_patterns(ALICE), "her vector": [vector[:64]]},
        {"her vector": as_floats},
    )
    if isinstance(store, SQLiteStore):
        await store.flush_deleted()  # everything on disk, for the control scan of the raw file
    assert {hit.split(" in ")[0] for hit in hits_in(store, tmp_path, needles)} == {
        "her words",
        "her key",
        "her vector",
    }  # the control: the scan does see her

    assert await channels.forget_speaker(ALICE) == 2
    assert hits_in(store, tmp_path, needles) == set()
    bob = Needles({"bob's words": text_patterns(kept)}, {})
    assert hits_in(store, tmp_path, bob)  # bob's line survives
    assert texts((await channels.search(GENERAL, kept, 5)).items) == [f"bob says {kept}"]


async def _vector_of(store: Store, agent_id: str, text: str) -> bytes:
    if isinstance(store, SQLiteStore):
        rows = await store.run_in_db(
            lambda conn: conn.execute(
                "SELECT embedding FROM messages WHERE agent_id = ? AND content = ?", (agent_id, text)
            ).fetchall()
        )
        return bytes(rows[0][0])
    assert isinstance(store, MongoStore)
    doc = await store.collection("messages").find_one({"agent_id": agent_id, "content": text})
    assert doc is not None
    vector = await store.collection("message_vectors").find_one({"agent_id": agent_id, "seq": doc["seq"]})
    assert vector is not None
    return np.asarray(vector["embedding"], dtype="<f4").tobytes()
