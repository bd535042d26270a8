"""Debounce (bot/durable/debounce.py): quick messages of one person in one
place become one event with one answer, and the durable-event pipeline keeps
its promises for such batches. Through the real Slack adapter over HTTP, a
real Runtime on a SQLite file and the scripted LLM server (its raw request
bodies say what reached the model). The crash harness runs with debounce on
in tests/test_crash_harness.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import discord.ext.test as dpytest
from discord.ext.test import backend

from bot.durable.debounce import Debouncer, merge
from bot.durable.inbox import Inbox
from bot.events import Event, Reply, UserJoined, UserMessage
from memory.places import Place
from memory.sqlite.store import SQLiteStore
from memory.types import Message
from memory.working_context import default_blocks
from tests import test_discord_adapter as discord_tests
from tests import test_slack_adapter as slack_tests
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, say
from tests.helpers import user_texts
from tests.test_discord_adapter import Harness
from tests.test_discord_adapter import sent as discord_sent
from tests.test_slack_adapter import SlackBot, Start, dm, eventually
from tests.test_slack_durability import recorded

# The Slack adapter tests' fixtures: a fake Slack Web API and a bot in HTTP mode on a real runtime.
fake_slack = slack_tests.fake_slack
start_bot = slack_tests.start_bot
discord_bot = discord_tests.discord_bot  # dpytest drives discord.py's real dispatch

WINDOW = 0.4  # seconds: long enough for a few HTTP posts on a busy machine, short for the suite
KEY = "slack:T1:U1"


def user_lines(request: dict[str, Any]) -> list[str]:
    return user_texts(request)


async def debounced_bot(start_bot: Start, make_runtime: RuntimeFactory) -> SlackBot:
    return await start_bot(await make_runtime(debounce_seconds=WINDOW))


async def quiet(bot: SlackBot) -> None:
    """Every burst closed and handled."""
    await asyncio.sleep(WINDOW * 1.5)
    await bot.adapter.drain()


# --------------------------------------------------------------------------- the window, on a clock


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_takes_messages_while_each_comes_within_the_window_up_to_the_cap() -> None:
    clock = Clock()
    bursts: Debouncer[str] = Debouncer(1.0, clock=clock, cap_factor=4, max_members=5)
    first = bursts.join("alice dm", "m1")
    assert first is not None and first.leader == "m1"
    clock.now += 0.9
    assert bursts.join("alice dm", "m2") is None  # within the window: joins
    assert bursts.join("bob dm", "b1") is not None  # another person (or place): a burst of its own
    clock.now += 0.9
    assert bursts.join("alice dm", "m3") is None  # the window restarted with m2
    clock.now += 0.9
    assert bursts.join("alice dm", "m4") is None
    clock.now += 0.9  # 3.6 s after the first: still under the cap of 4 windows
    assert bursts.join("alice dm", "m5") is None
    assert first.members == ["m1", "m2", "m3", "m4", "m5"]
    assert bursts.join("alice dm", "m6") is not None  # full (max_members): the next burst starts
    clock.now += 0.5
    second = bursts.join("alice dm", "m7")
    assert second is None
    clock.now += 5
    third = bursts.join("alice dm", "m8")  # after the window: a new burst
    assert third is not None and third.members == ["m8"]


def test_the_cap_closes_a_burst_of_a_chatty_person() -> None:
    clock = Clock()
    bursts: Debouncer[int] = Debouncer(1.0, clock=clock, cap_factor=2, max_members=100)
    assert bursts.join("k", 0) is not None
    for n in range(1, 4):
        clock.now += 0.6
        assert (bursts.join("k", n) is None) == (clock.now - 100.0 < 2.0), n


def test_a_window_of_zero_never_batches() -> None:
    bursts: Debouncer[str] = Debouncer(0.0, clock=Clock())
    assert all(bursts.join("k", m) is not None for m in ("a", "b", "c"))


async def test_gather_waits_for_quiet_and_closes_the_burst() -> None:
    bursts: Debouncer[str] = Debouncer(0.15)
    burst = bursts.join("k", "a")
    assert burst is not None
    gathered = asyncio.create_task(bursts.gather(burst))
    await asyncio.sleep(0.1)
    assert bursts.join("k", "b") is None and not gathered.done()
    assert await gathered == ["a", "b"]
    assert bursts.join("k", "c") is not None  # closed: a new burst


def message(text: str, **fields: Any) -> UserMessage:
    return UserMessage(**{"platform": "slack", "user_id": "T1:U1", "text": text, "in_inbox": True, **fields})


def test_only_plain_durable_messages_of_one_person_in_one_place_merge() -> None:
    a, b = message("a"), message("b")
    assert merge([[a], [b]]) is a and a.followers == [b] and a.members() == [a, b]
    assert merge([[message("alone")]]) is None
    assert merge([[message("a")], [message("b", user_id="T1:U2")]]) is None
    channel = Place(kind="public", id="C1", name="general")
    assert merge([[message("a")], [message("b", place=channel)]]) is None
    assert merge([[message("a")], [UserMessage(platform="slack", user_id="T1:U1", text="b")]]) is None  # not durable
    joined: list[Event | Reply] = [UserJoined(platform="slack", user_id="T1:U1", in_inbox=True)]
    assert merge([[message("a")], joined]) is None
    assert merge([[message("a")], [message("b"), message("c")]]) is None  # a member of several events


# --------------------------------------------------------------------------- Slack, end to end


async def test_three_quick_messages_get_one_answer_that_saw_all_three(
    start_bot: Start, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    bot = await debounced_bot(start_bot, make_runtime)
    llm_server.set_handler(lambda request: say("one answer to all three"))
    for n, text in enumerate(("I moved", "to Lisbon", "last week")):
        assert await bot.event(dm(text), event_id=f"EvB{n}") == 200
    assert await bot.texts(1) == ["one answer to all three"]
    await quiet(bot)
    assert bot.slack.posted_texts() == ["one answer to all three"]
    # One step sequence, one request, holding the three messages in order, each its own line.
    [request] = llm_server.requests
    assert [line.rsplit(": ", 1)[-1] for line in user_lines(request)[-3:]] == ["I moved", "to Lisbon", "last week"]
    # Each message recorded once, under its own event id (a redo finds each); the reply under the leader's.
    record = await bot.runtime.store.find_agent(KEY)
    assert record is not None
    messages = await bot.runtime.store.messages_since(record.id, 0)
    assert [m.event_id for m in messages if m.role == "user"] == ["EvB0", "EvB1", "EvB2"]
    assert [e.text for e in await bot.runtime.store.outbox_for_event("EvB0")] == ["one answer to all three"]
    assert await bot.runtime.store.outbox_for_event("EvB1") == []
    assert await bot.runtime.store.inbox_pending("slack") == []  # every member finished


async def test_messages_in_two_places_or_of_two_people_are_not_merged(
    start_bot: Start, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    bot = await debounced_bot(start_bot, make_runtime)
    llm_server.set_handler(lambda request: say(f"re: {user_lines(request)[-1].rsplit(': ', 1)[-1]}"))
    mention = {"type": "app_mention", "channel": "C1", "user": "U1", "team": "T1", "ts": "1700000000.000300"}
    assert await bot.event(dm("in my DM")) == 200
    assert await bot.event({**mention, "text": "<@UBOT> in general"}) == 200
    assert await bot.event(dm("Bob here", user="U2")) == 200
    await bot.texts(3)
    await quiet(bot)
    assert sorted(bot.slack.posted_texts()) == sorted(["re: in my DM", "<@U1> re: in general", "re: Bob here"])
    assert len(llm_server.requests) == 3


async def test_a_message_after_the_window_is_an_event_of_its_own(
    start_bot: Start, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    bot = await debounced_bot(start_bot, make_runtime)
    llm_server.set_handler(lambda request: say(f"re: {user_lines(request)[-1].rsplit(': ', 1)[-1]}"))
    assert await bot.event(dm("first")) == 200
    assert await bot.texts(1) == ["re: first"]
    assert await bot.event(dm("second")) == 200
    assert await bot.texts(2) == ["re: first", "re: second"]
    assert len(llm_server.requests) == 2


# --------------------------------------------------------------------------- after a crash


async def batch_left_by_a_crash(bot: SlackBot, *, recorded_messages: bool) -> None:
    """What a SIGKILL during a batch leaves: three recorded in the inbox messages, the
    last two linked to the first; with `recorded_messages`, all three
    recorded (the batch's one write), no answer yet."""
    texts = {"EvC0": "I moved", "EvC1": "to Lisbon", "EvC2": "last week"}
    for event_id, text in texts.items():
        await bot.runtime.receive("slack", event_id, "T1:U1", recorded(event_id, text))
    await bot.runtime.store.inbox_absorb("EvC0", ["EvC1", "EvC2"])
    if recorded_messages:
        agent = await bot.runtime.agent(KEY)
        await agent.record_messages(
            [
                Message(
                    role="user",
                    content=message(text, event_id=event_id).render(),
                    name="user_message",
                    event_id=event_id,
                )
                for event_id, text in texts.items()
            ]
        )


async def test_followers_of_a_recorded_batch_are_not_answered_again_after_a_crash(
    start_bot: Start, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    bot = await debounced_bot(start_bot, make_runtime)
    await batch_left_by_a_crash(bot, recorded_messages=True)
    llm_server.set_handler(lambda request: say("answer to the batch"))
    assert await bot.adapter.recover() == 3  # replays are never debounced: one by one
    await quiet(bot)
    assert bot.slack.posted_texts() == ["answer to the batch"]  # the leader's redo answers all three
    [request] = llm_server.requests
    assert [line.rsplit(": ", 1)[-1] for line in user_lines(request)[-3:]] == ["I moved", "to Lisbon", "last week"]
    record = await bot.runtime.store.find_agent(KEY)
    assert record is not None
    user_ids = [m.event_id for m in await bot.runtime.store.messages_since(record.id, 0) if m.role == "user"]
    assert user_ids == ["EvC0", "EvC1", "EvC2"]  # nothing recorded twice
    assert await bot.runtime.store.inbox_pending("slack") == []


async def test_followers_of_a_batch_that_was_never_recorded_are_answered_on_their_own(
    start_bot: Start, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    bot = await debounced_bot(start_bot, make_runtime)
    await batch_left_by_a_crash(bot, recorded_messages=False)
    llm_server.set_handler(lambda request: say(f"re: {user_lines(request)[-1].rsplit(': ', 1)[-1]}"))
    assert await bot.adapter.recover() == 3
    await quiet(bot)
    assert bot.slack.posted_texts() == ["re: I moved", "re: to Lisbon", "re: last week"]
    await eventually(lambda: True)
    assert await bot.runtime.store.inbox_pending("slack") == []


# --------------------------------------------------------------------------- Discord


async def test_discord_quick_messages_get_one_answer_and_each_is_journaled(discord_bot: Harness) -> None:
    discord_bot.adapter.pipeline.bursts = Debouncer(WINDOW)
    discord_bot.llm.set_handler(lambda request: say("one answer to all three"))
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    ids = [backend.make_message(text, alice, dm).id for text in ("I moved", "to Lisbon", "last week")]
    await dpytest.run_all_events()
    await eventually(lambda: not dpytest.sent_queue.empty())
    await asyncio.sleep(WINDOW)  # anything more would have come by now
    await dpytest.run_all_events()
    assert [m.content for m in discord_sent()] == ["one answer to all three"]
    [request] = discord_bot.llm.requests
    assert [line.rsplit(": ", 1)[-1] for line in user_lines(request)[-3:]] == ["I moved", "to Lisbon", "last week"]
    runtime = discord_bot.runtime
    record = await runtime.store.find_agent(f"discord:{alice.id}")
    assert record is not None
    messages = await runtime.store.messages_since(record.id, 0)
    assert [m.event_id for m in messages if m.role == "user"] == [str(i) for i in ids]
    assert await runtime.store.inbox_pending("discord") == []


# --------------------------------------------------------------------------- the inbox's side


async def test_a_batch_links_its_followers_and_waits_for_storage_whole(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "memgpt.sqlite3")
    await store.open()
    try:
        inbox = Inbox(store)
        for event_id in ("EvL", "EvF1", "EvF2"):
            await inbox.receive("slack", event_id, "T1:U1", recorded(event_id, event_id))
        leader = merge(
            [[message("a", event_id="EvL")], [message("b", event_id="EvF1")], [message("c", event_id="EvF2")]]
        )
        assert leader is not None
        await inbox.started(leader)
        entries = {e.event_id: (e.state, e.absorbed_into) for e in await store.inbox_pending("slack")}
        assert entries == {"EvL": ("running", ""), "EvF1": ("pending", "EvL"), "EvF2": ("pending", "EvL")}
        # Storage gave out for the whole wait: every member waits for a replay, none is finished.
        await inbox.wait_for_storage(leader)
        for member in leader.members():
            await inbox.finished(member.inbox_id)
        assert {e.event_id: e.state for e in await store.inbox_pending("slack")} == dict.fromkeys(
            ("EvL", "EvF1", "EvF2"), "waiting"
        )
        # Replayed one by one: a follower whose message its batch recorded is answered by the
        # leader's run; one whose message is not recorded is an event of its own; so is the leader.
        assert [r.event_id for r in await inbox.leftovers("slack")] == ["EvL", "EvF1", "EvF2"]
        agent, _ = await store.get_or_create_agent("slack:T1:U1", default_blocks(2_000, 2_000))
        await store.append_messages(agent.id, [Message(role="user", content="b", event_id="EvF1")])
        answered = [await inbox.answered_with_its_batch(agent.id, member) for member in leader.members()]
        assert answered == [False, True, False]
        # EvF2 is an event of its own now, unlinked: its own run records its message, dies
        # before answering, and the next start must redo it, not finish it as answered.
        assert {e.event_id: e.absorbed_into for e in await store.inbox_pending("slack")}["EvF2"] == ""
        await store.append_messages(agent.id, [Message(role="user", content="c", event_id="EvF2")])
        restarted = Inbox(store)
        replayed = {r.event_id for r in await restarted.leftovers("slack")}
        assert "EvF2" in replayed, replayed
        assert not await restarted.answered_with_its_batch(agent.id, leader.members()[2])
    finally:
        await store.close()
