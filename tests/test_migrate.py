"""`memgpt-bot migrate`: SQLite -> MongoDB (FerretDB, or MONGODB_TEST_URI) ->
SQLite gives back every agent exactly."""

from __future__ import annotations

import argparse
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from cli.migrate import MigrationError, add_migrate_command, cmd_migrate, migrate, open_store, parse_spec
from memory.backends import StoreURL
from memory.ingest.reading import passage_hash
from memory.mongo.store import MongoStore
from memory.schedules import CheckinPrefs, Schedule
from memory.sqlite.store import SQLiteStore
from memory.store import DocumentRecord, Store
from memory.types import Block, Message, Passage
from tests.mongo_server import MongoTarget, mongo_store, mongo_target

__all__ = ["mongo_store", "mongo_target"]  # the session fixture, imported to be found here

T0 = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)
CALL = {"id": "call_1", "type": "function", "function": {"name": "archival_memory_search", "arguments": '{"q": 1}'}}


async def fill(store: Store) -> None:
    """Two people, a shared collection attached to all but one of them, a
    second attached to one; every kind of field filled in somewhere."""
    blocks = [Block("persona", "kind", 500), Block("human", "", 500)]
    alice, _ = await store.get_or_create_agent("discord:alice", blocks)
    await store.save_block(alice.id, Block("notes", "likes tea ☕", 300, updated_at=T0))
    await store.append_messages(
        alice.id,
        [
            Message("system", "You are MemGPT.", created_at=T0),
            Message("user", "hi ünïcode 🦄", name="alice", created_at=T0 + timedelta(seconds=1)),
            Message("assistant", None, tool_calls=[CALL], created_at=T0 + timedelta(seconds=2)),
            Message(
                "tool",
                '{"ok": true}',
                tool_call_id="call_1",
                name="archival_memory_search",
                created_at=datetime(2024, 5, 17, 11, 30, 18, 5, tzinfo=timezone(timedelta(hours=2))),
            ),
            *(Message("user", f"message {n}", created_at=T0 + timedelta(minutes=n)) for n in range(5, 12)),
            Message("user", "said in #general", created_at=T0 + timedelta(minutes=20), place="public:C1"),
        ],
    )
    await store.update_queue(alice.id, "Alice likes tea.", 4, T0 + timedelta(hours=1))
    await store.get_conversation(alice.id, "public:C1", "#general")
    await store.update_queue(alice.id, "Chat in #general.", 12, T0 + timedelta(hours=2), place="public:C1")
    await store.insert_passages(
        alice.id,
        [
            Passage("saved by the agent", created_at=T0, embedding=[0.6, 0.8]),
            Passage("not embedded yet", source="notes.md", position="p2", created_at=T0 + timedelta(1)),
            Passage("a team fact", created_at=T0, embedding=[0.8, 0.6], place="private:C2"),
        ],
    )
    loaded = [
        Passage("chunk one", source="guide.md", position="1", created_at=T0, embedding=[1.0, 0.0]),
        Passage("chunk two", source="guide.md", position="2", created_at=T0, embedding=[0.0, 1.0]),
    ]
    await store.insert_hashed_passages(alice.id, loaded, [passage_hash(p.text) for p in loaded])
    await store.record_document(alice.id, DocumentRecord("a" * 64, "guide.md", 2, T0 + timedelta(seconds=30)))

    bob, _ = await store.get_or_create_agent("slack:T1:U2", [Block("human", "Bob", 100)])
    docs, _ = await store.create_source("docs")
    await store.insert_hashed_passages(docs.id, [Passage("shared fact", embedding=[0.5, 0.5])], [passage_hash("x")])
    await store.record_document(docs.id, DocumentRecord("b" * 64, "facts.txt", 1, T0))
    faq, _ = await store.create_source("faq")
    await store.attach_source(docs.id, None)
    await store.detach_source(docs.id, bob.id)
    await store.attach_source(faq.id, alice.id)


async def snapshot(store: Store) -> dict[str, object]:
    """Everything the store holds, without the ids it assigns itself."""
    agents = await store.list_agents()
    keys = {agent.id: agent.key for agent in agents}
    out: dict[str, object] = {}
    for agent in agents:
        passages = await store.list_passages(agent.id, 1000)
        out[agent.key] = {
            "queue": [
                (c.place, c.name, c.summary, c.queue_start_seq, c.summary_updated_at)
                for c in await store.list_conversations(agent.id)
            ],
            "blocks": await store.load_blocks(agent.id),
            "messages": await store.messages_since(agent.id, 0),
            "passages": [(p.text, p.source, p.position, p.created_at, p.embedding, p.place) for p in passages],
            "pending": [p.text for p in await store.passages_without_embedding(agent.id)],
            "hashes": await store.known_passage_hashes(agent.id, [passage_hash(p.text) for p in passages]),
            "documents": await store.list_documents(agent.id),
            "sees": [source.name for source in await store.attached_sources(agent.id)],
        }
    out["sources"] = [
        (s.name, s.attach_all, sorted(keys[a] for a in await store.source_attachments(s.id)))
        for s in await store.list_sources()
    ]
    out["order"] = [agent.key for agent in agents]
    return out


@pytest.fixture
def mongo(mongo_store: MongoStore) -> MongoStore:
    return mongo_store


async def test_sqlite_to_mongodb_to_sqlite_round_trips_every_agent(tmp_path: Path, mongo: MongoStore) -> None:
    first, last = SQLiteStore(tmp_path / "first.db"), SQLiteStore(tmp_path / "last.db")
    await first.open()
    await last.open()
    try:
        await fill(first)
        there = await migrate(first, mongo, progress=False)
        assert there.ok, there.summary()
        assert [a.status for a in there.agents] == ["copied"] * 4 and there.sources == 2
        back = await migrate(mongo, last, progress=False)
        assert back.ok, back.summary()
        original = await snapshot(first)
        assert await snapshot(mongo) == original
        assert await snapshot(last) == original
        alice, bob = original["discord:alice"], original["slack:T1:U2"]
        assert isinstance(alice, dict) and isinstance(bob, dict)
        assert [m.seq for m in alice["messages"]] == list(range(1, 13))
        assert alice["queue"] == [
            ("dm", "", "Alice likes tea.", 4, T0 + timedelta(hours=1)),
            ("public:C1", "#general", "Chat in #general.", 12, T0 + timedelta(hours=2)),
        ]
        assert len(alice["hashes"]) == 2 and alice["pending"] == ["not embedded yet"]
        assert alice["sees"] == ["docs", "faq"] and bob["sees"] == []
        assert original["sources"] == [("docs", True, []), ("faq", False, ["discord:alice"])]
    finally:
        await first.close()
        await last.close()


async def test_agents_already_in_the_target_are_left_alone_and_reported(tmp_path: Path, mongo: MongoStore) -> None:
    source = SQLiteStore(tmp_path / "source.db")
    await source.open()
    try:
        await fill(source)
        mine, _ = await mongo.get_or_create_agent("discord:alice", [Block("human", "another Alice", 50)])
        report = await migrate(source, mongo, progress=False)
        assert not report.ok
        statuses = {agent.key: agent.status for agent in report.agents}
        assert statuses == {
            "discord:alice": "skipped",
            "slack:T1:U2": "copied",
            "source:docs": "copied",
            "source:faq": "copied",
        }
        assert "discord:alice: skipped: already in the target" in report.summary()
        assert [b.value for b in await mongo.load_blocks(mine.id)] == ["another Alice"]
        assert await mongo.count_messages(mine.id) == 0
    finally:
        await source.close()


async def test_the_command_copies_between_specs(
    tmp_path: Path, mongo_target: MongoTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    source = SQLiteStore(tmp_path / "source.db")
    await source.open()
    await fill(source)
    await source.close()
    parser = argparse.ArgumentParser(prog="memgpt-bot")
    add_migrate_command(parser.add_subparsers(dest="command"))
    database = mongo_target.database_name()
    args = parser.parse_args(
        ["migrate", "--from", f"sqlite:{tmp_path / 'source.db'}", "--to", f"{mongo_target.uri.rstrip('/')}/{database}"]
    )
    assert args.func is cmd_migrate
    assert await args.func(args) == 0
    captured = capsys.readouterr()
    assert "4 of 4 agents copied (12 messages, 6 passages, 2 loaded files), 2 shared collections" in captured.out
    assert "verified" in captured.out and "migrate" in captured.err  # the progress bar
    copy = mongo_target.store(database)
    await copy.open()
    try:
        keys = [a.key for a in await copy.list_agents()]
        assert keys == ["discord:alice", "slack:T1:U2", "source:docs", "source:faq"]
    finally:
        await copy.close()  # drops the database


async def test_specs() -> None:
    home = parse_spec("sqlite:~/x.db")
    assert home.scheme == "sqlite" and not home.location.startswith("~")
    assert parse_spec("mongodb://u:p@h1,h2/bot?replicaSet=rs0") == StoreURL(
        "mongodb", "mongodb://u:p@h1,h2/bot?replicaSet=rs0", "bot"
    )
    assert parse_spec("mongodb+srv://cluster.example.net/").database == "memgpt"
    assert isinstance(open_store("sqlite:/tmp/x.db"), SQLiteStore)
    assert isinstance(open_store("mongodb://localhost/db"), MongoStore)
    with pytest.raises(MigrationError, match="neither") as caught:
        parse_spec("postgres://u:hunter22@h/db")
    assert "hunter22" not in str(caught.value)
    with pytest.raises(MigrationError, match="same store"):
        same = argparse.Namespace(source="sqlite:/tmp/a/../x.db", target="sqlite:/tmp/x.db", no_progress=True)
        await cmd_migrate(same)


async def test_check_ins_preferences_and_exemptions_are_copied_and_verified(tmp_path: Path, mongo: MongoStore) -> None:
    first, last = SQLiteStore(tmp_path / "first.db"), SQLiteStore(tmp_path / "last.db")
    await first.open()
    await last.open()
    try:
        await fill(first)
        schedules = first.schedules
        reminder = Schedule(
            id="",
            agent_key="discord:alice",
            platform="discord",
            user_id="alice",
            kind="once",
            run_at=T0 + timedelta(days=400),
            note="call mum",
            reply_to={"channel": 5},
            next_fire_at=T0 + timedelta(days=400),
            created_at=T0,
        )
        await schedules.add(reminder)
        daily = replace(reminder, id="", kind="daily", time_of_day="09:00", run_at=None, timezone="Europe/Paris")
        await schedules.add(daily)
        prefs = CheckinPrefs("discord:alice", timezone="Europe/Paris", quiet_start="22:00", quiet_end="07:00")
        await schedules.save_prefs(prefs)
        await first.set_usage_exempt("slack:T1:U2", True, T0)

        there = await migrate(first, mongo, progress=False)
        assert there.ok, there.summary()
        assert (there.schedules, there.prefs, there.exemptions) == (2, 1, 1)
        assert "2 check-ins and reminders, 1 users' time zone and quiet hours, 1 exemptions" in there.summary()
        back = await migrate(mongo, last, progress=False)
        assert back.ok, back.summary()
        copied = last.schedules
        assert sorted((s.id, s.kind, s.note) for s in await copied.list_all()) == sorted(
            (s.id, s.kind, s.note) for s in await schedules.list_all()
        )
        assert await copied.get_prefs("discord:alice") == prefs
        assert await last.list_usage_exempt() == ["slack:T1:U2"]
    finally:
        await first.close()
        await last.close()


async def test_a_missing_source_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent.sqlite3"
    args = argparse.Namespace(source=f"sqlite:{missing}", target=f"sqlite:{tmp_path / 'to.db'}", no_progress=True)
    with pytest.raises(MigrationError, match="does not exist"):
        await cmd_migrate(args)
    assert not missing.exists() and not (tmp_path / "to.db").exists()


async def test_channel_memories_keep_their_speakers_message_ids_and_consent(tmp_path: Path, mongo: MongoStore) -> None:
    # A channel's memory is an agent keyed channel:...; its lines carry speaker fields and the
    # platform's message id (exactly once), and each person's choice about channel memory is copied.
    first, last = SQLiteStore(tmp_path / "first.db"), SQLiteStore(tmp_path / "last.db")
    await first.open()
    await last.open()
    try:
        await fill(first)
        channel, _ = await first.get_or_create_agent("channel:slack:T1:C9", [])
        lines = [
            Message(
                "user",
                f"line {n}",
                name="channel_line",
                created_at=T0 + timedelta(minutes=n),
                event_id=f"171.{n}",
                place="public:C9",
                speaker="slack:T1:U2",
                speaker_name="bob",
                edited_at=T0 + timedelta(hours=n) if n == 2 else None,
            )
            for n in range(1, 4)
        ]
        for line in lines:
            assert await first.append_messages(channel.id, [line], unless_event=line.event_id)
        await first.set_channel_consent("slack:T1:U2", True, T0)
        await first.set_channel_consent("discord:carol", False, T0 + timedelta(days=1))

        there = await migrate(first, mongo, progress=False)
        assert there.ok, there.summary()
        assert there.consents == 2
        assert "2 channel memory choices" in there.summary()
        back = await migrate(mongo, last, progress=False)
        assert back.ok, back.summary()
        assert await snapshot(last) == await snapshot(first)
        copied = await last.find_agent("channel:slack:T1:C9")
        assert copied is not None
        held = await last.messages_since(copied.id, 0)
        assert [(m.event_id, m.speaker, m.speaker_name, m.edited_at) for m in held] == [
            (f"171.{n}", "slack:T1:U2", "bob", T0 + timedelta(hours=2) if n == 2 else None) for n in range(1, 4)
        ]
        # Exactly once survives the move: a re-delivered line is not kept again.
        assert await last.append_messages(copied.id, [replace(lines[0], seq=0)], unless_event="171.1") == []
        assert await last.speaker_message_counts("slack:T1:U2") == {"channel:slack:T1:C9": 3}
        choices = await last.list_channel_consent()
        assert [(speaker, keep) for speaker, keep, _ in choices] == [("discord:carol", False), ("slack:T1:U2", True)]
        assert abs((choices[1][2] - T0).total_seconds()) < 0.001
    finally:
        await first.close()
        await last.close()
