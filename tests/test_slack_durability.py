"""Slack and the crash-safety protocol (bot/durable/), in process: events
recorded in the inbox before the ack, replies through the outbox, failed sends retried
with backoff, undeliverable ones dropped, and resends that check Slack first.
(tests/test_crash_harness.py kills a real bot process instead.)"""

from __future__ import annotations

import asyncio
import logging

import pytest

from adapters.slack import METADATA_TYPE
from bot.durable.inbox import GAVE_UP, MAX_RESTARTS, Inbox
from bot.durable.outbox import retry_delay
from bot.durable.redelivery import Redelivery
from bot.events import UserMessage
from memory.types import Message
from tests import test_slack_adapter as slack_tests
from tests.fake_llm import FakeLLMServer, InFlightProbe, Reply, say
from tests.helpers import user_texts
from tests.test_slack_adapter import SlackBot, Start, dm, eventually

# The Slack adapter tests' fixtures: a fake Slack Web API and a bot in HTTP mode on a real runtime.
fake_slack = slack_tests.fake_slack
start_bot = slack_tests.start_bot
bot = slack_tests.bot

KEY = "slack:T1:U1"


async def agent_id(bot: SlackBot) -> str:
    record = await bot.runtime.store.find_agent(KEY)
    assert record is not None
    return record.id


async def test_an_event_is_journaled_before_slack_gets_its_ack(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    gate = asyncio.Event()
    loop = asyncio.get_running_loop()

    def blocked(request: dict[str, object]) -> Reply:
        asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(10)
        return say("answered")

    llm_server.set_handler(blocked)
    assert await bot.event(dm("remember me"), event_id="EvJ1") == 200
    # Acked while the model is still thinking: the event is in the inbox, pending.
    pending = await bot.runtime.store.inbox_pending("slack")
    assert [entry.event_id for entry in pending] == ["EvJ1"]
    assert pending[0].payload["event"]["text"] == "remember me"
    gate.set()
    assert await bot.texts(1) == ["answered"]
    await eventually(lambda: True)
    await bot.adapter.drain()
    assert await bot.runtime.store.inbox_pending("slack") == []
    [sent] = await bot.runtime.store.outbox_for_event("EvJ1")
    assert sent.state == "sent" and sent.text == "answered"
    # A repeat delivery of the same id is acknowledged and not worked on again.
    assert await bot.event(dm("remember me"), event_id="EvJ1") == 200
    await bot.adapter.drain()
    assert len(llm_server.requests) == 1


async def test_a_replayed_event_is_answered_once_and_recorded_once(start_bot: Start, llm_server: FakeLLMServer) -> None:
    """A crash after the inbox and the user message were written, before any
    answer: the restart redoes the steps without recording the message again."""
    bot = await start_bot()
    llm_server.set_handler(lambda request: say("first run answer"))
    # What a killed run leaves behind: the event recorded in the inbox, its message recorded, no reply.
    payload_event = dm("are you there?")
    await bot.runtime.receive(
        "slack",
        "EvR1",
        "T1:U1",
        {
            "kind": "message",
            "event": payload_event,
            "origin": {
                "team": "T1",
                "user": "U1",
                "reply_to": {"channel": "DU1"},
                "event_id": "EvR1",
                "created_at": "2026-11-30T10:00:00+00:00",
            },
        },
    )
    from bot.events import UserMessage
    from memory.types import Message

    agent = await bot.runtime.agent(KEY)
    event = UserMessage(platform="slack", user_id="T1:U1", text="are you there?", event_id="EvR1", in_inbox=True)
    await agent.record_messages([Message(role="user", content=event.render(), name=event.kind, event_id="EvR1")])
    llm_server.set_handler(lambda request: say("after the restart"))
    assert await bot.adapter.recover() == 1
    assert await bot.texts(1) == ["after the restart"]
    messages = await bot.runtime.store.messages_since(await agent_id(bot), 0)
    assert sum(1 for m in messages if m.event_id == "EvR1") == 1
    assert await bot.runtime.store.inbox_pending("slack") == []


async def test_a_reply_posted_but_unconfirmed_is_not_posted_again(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    llm_server.script(say("only once please"))
    assert await bot.event(dm("hello"), event_id="EvP1") == 200
    assert await bot.texts(1) == ["only once please"]
    await bot.adapter.drain()
    # As if the process died between Slack's answer and recording it.
    await bot.runtime.store.outbox_update("EvP1:0", state="pending")
    bot.runtime.outbox.started_at = 1e12  # the entry now looks left over from a previous run
    retrier = Redelivery(bot.runtime.inbox, bot.runtime.outbox, {"slack": bot.adapter.deliver})
    assert await retrier.run_once() == 1
    assert bot.slack.posted_texts() == ["only once please"]
    [history] = bot.slack.calls_to("conversations.history")
    assert history.args["channel"] == "DU1"
    assert [entry.state for entry in await bot.runtime.store.outbox_for_event("EvP1")] == ["sent"]


async def test_a_failed_send_is_retried_with_backoff_until_it_goes_through(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    clock = [1_000_000.0]
    bot.runtime.outbox.clock = lambda: clock[0]
    llm_server.script(say("eventually delivered"))
    bot.slack.fail("chat.postMessage", "internal_error", status=500, times=4)  # the SDK itself retries none of these
    assert await bot.event(dm("hi"), event_id="EvF1") == 200
    await bot.adapter.drain()
    [entry] = await bot.runtime.store.outbox_for_event("EvF1")
    assert (entry.state, entry.attempts, entry.next_try_at) == ("pending", 1, clock[0] + retry_delay(1))
    retrier = Redelivery(bot.runtime.inbox, bot.runtime.outbox, {"slack": bot.adapter.deliver})
    assert await retrier.run_once() == 0  # not due yet
    delays = []
    for _ in range(3):  # three more failures, each waiting twice as long
        clock[0] = entry.next_try_at
        assert await retrier.run_once() == 1
        [entry] = await bot.runtime.store.outbox_for_event("EvF1")
        delays.append(entry.next_try_at - clock[0])
    assert delays == [retry_delay(2), retry_delay(3), retry_delay(4)] and delays[0] < delays[1] < delays[2]
    clock[0] = entry.next_try_at
    assert await retrier.run_once() == 1
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == ["eventually delivered"]
    assert len(bot.slack.calls_to("chat.postMessage")) == 5  # 4 failures, then through
    assert [e.state for e in await bot.runtime.store.outbox_for_event("EvF1")] == ["sent"]
    assert await retrier.run_once() == 0


async def test_a_reply_to_someone_gone_is_dropped_with_a_log_line(
    bot: SlackBot, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.script(say("you will never read this"))
    bot.slack.fail("chat.postMessage", "account_inactive")
    with caplog.at_level(logging.WARNING):
        assert await bot.event(dm("bye"), event_id="EvG1") == 200
        await bot.adapter.drain()
    [entry] = await bot.runtime.store.outbox_for_event("EvG1")
    assert entry.state == "dropped"
    assert any("EvG1:0" in r.getMessage() and "account_inactive" in r.getMessage() for r in caplog.records)
    assert all("you will never read this" not in r.getMessage() for r in caplog.records)
    bot.runtime.outbox.started_at = 1e12
    retrier = Redelivery(bot.runtime.inbox, bot.runtime.outbox, {"slack": bot.adapter.deliver})
    assert await retrier.run_once() == 0  # never retried
    assert len(bot.slack.calls_to("chat.postMessage")) == 1


async def test_events_of_one_user_are_replayed_in_order(start_bot: Start, llm_server: FakeLLMServer) -> None:
    bot = await start_bot()
    for n in range(5):
        await bot.runtime.receive(
            "slack",
            f"EvO{n}",
            "T1:U1",
            {
                "kind": "message",
                "event": dm(f"number {n}"),
                "origin": {
                    "team": "T1",
                    "user": "U1",
                    "reply_to": {"channel": "DU1"},
                    "event_id": f"EvO{n}",
                    "created_at": "2026-11-30T10:00:00+00:00",
                },
            },
        )
    probe = InFlightProbe(lambda request: say("ok " + user_texts(request)[-1].rsplit(" ", 1)[-1]))
    llm_server.set_handler(probe)
    assert await bot.adapter.recover() == 5
    assert await bot.texts(5) == [f"ok {n}" for n in range(5)]
    assert probe.most == 1  # one at a time, in arrival order
    posts = bot.slack.calls_to("chat.postMessage")
    assert all(post.args["metadata"]["event_type"] == METADATA_TYPE for post in posts)


async def test_a_replayed_upload_neither_repeats_its_notice_nor_its_answer(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(lambda request: say("I read your notes."))
    shared = bot.slack.add_file(
        "notes.md", "# Garden\n\nBasil likes sun.", mimetype="text/markdown", filetype="markdown"
    )
    assert await bot.event(dm("", subtype="file_share", files=[shared]), event_id="EvU1") == 200
    await bot.adapter.drain()
    first = [m["text"] for m in bot.slack.messages_in("DU1")]
    assert first == ["Saved notes.md to my memory (1 passage).", "I read your notes."]
    calls = len(llm_server.requests)
    # As if the process died after the replies went out, before the event was marked done.
    await bot.runtime.store.inbox_update("EvU1", state="pending")
    assert await bot.adapter.recover() == 1
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == first
    assert len(llm_server.requests) == calls


async def test_a_retried_reply_is_not_overtaken_by_the_persons_later_replies(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    clock = [1_000_000.0]
    bot.runtime.outbox.clock = lambda: clock[0]
    llm_server.set_handler(lambda request: say("re: " + user_texts(request)[-1].rsplit(" ", 1)[-1]))
    bot.slack.fail("chat.postMessage", "internal_error", status=500, times=1)
    assert await bot.event(dm("number one"), event_id="EvQ1") == 200
    await bot.adapter.drain()
    assert await bot.event(dm("number two"), event_id="EvQ2") == 200
    await bot.adapter.drain()
    # "two" waits behind "one" (its retry is not due yet): Slack has neither so far.
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == []
    assert len(bot.slack.calls_to("chat.postMessage")) == 1  # "two" was not even tried
    clock[0] += 60
    assert await Redelivery(bot.runtime.inbox, bot.runtime.outbox, {"slack": bot.adapter.deliver}).run_once() == 2
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == ["re: one", "re: two"]
    # Once through, the next reply goes out at once.
    assert await bot.event(dm("number three"), event_id="EvQ3") == 200
    await bot.adapter.drain()
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == ["re: one", "re: two", "re: three"]
    assert len(bot.runtime.doors.lanes) == 0  # nothing kept per user once idle


def recorded(event_id: str, text: str) -> dict[str, object]:
    """What the Slack adapter inboxes for a DM from U1."""
    return {
        "kind": "message",
        "event": dm(text),
        "origin": {
            "team": "T1",
            "user": "U1",
            "reply_to": {"channel": "DU1"},
            "event_id": event_id,
            "created_at": "2026-11-30T10:00:00+00:00",
        },
    }


async def test_restarts_before_an_event_ran_do_not_count_against_it(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    """The crash-harness defect: kills during start-up used up the first events' restarts."""
    await bot.runtime.receive("slack", "EvK1", "T1:U1", recorded("EvK1", "still there?"))
    for _ in range(MAX_RESTARTS * 2):  # the bot stopped each time before working on it
        assert [redo.notice for redo in await bot.runtime.inbox.leftovers("slack")] == [""]
    [entry] = await bot.runtime.store.inbox_pending("slack")
    assert (entry.state, entry.attempts) == ("pending", 0)
    llm_server.set_handler(lambda request: say("yes"))
    assert await bot.adapter.recover() == 1
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == ["yes"]
    assert await bot.runtime.store.inbox_pending("slack") == []


async def test_an_event_running_at_every_restart_is_given_up_and_the_person_told(
    bot: SlackBot, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    await bot.runtime.receive("slack", "EvX1", "T1:U1", recorded("EvX1", "poison"))
    for restart in range(1, MAX_RESTARTS):  # it was running alone each time the bot died
        await bot.runtime.store.inbox_update("EvX1", state="running", alone=True)
        assert [redo.notice for redo in await bot.runtime.inbox.leftovers("slack")] == [""]
        [entry] = await bot.runtime.store.inbox_pending("slack")
        assert (entry.attempts, entry.alone) == (restart, True)  # still a suspect, to run alone
    await bot.runtime.store.inbox_update("EvX1", state="running", alone=True)
    with caplog.at_level(logging.ERROR):
        assert await bot.adapter.recover() == 1
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == [GAVE_UP]
    assert llm_server.requests == []  # not run again
    assert any("giving up on slack event EvX1" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert await bot.runtime.store.inbox_pending("slack") == []


async def test_a_give_up_notice_is_sent_once_whatever_a_kill_interrupts(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    """The notice goes through the outbox like an answer: a kill after it was
    posted, before its report (then before the event's end), must not post it
    again at the next start (the poison test saw it twice on a busy machine)."""
    await bot.runtime.receive("slack", "EvX2", "T1:U1", recorded("EvX2", "poison"))
    await bot.runtime.store.inbox_update("EvX2", state="running", alone=True, attempts=MAX_RESTARTS - 1)
    assert await bot.adapter.recover() == 1
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == [GAVE_UP]
    [notice] = await bot.runtime.store.outbox_for_event("EvX2:notice")
    assert notice.state == "sent"
    # Killed after the post, before its report: the entry still pending, the event too.
    await bot.runtime.store.outbox_update(notice.id, state="pending")
    await bot.runtime.store.inbox_update("EvX2", state="pending")
    assert await bot.adapter.recover() == 1
    # Killed after the report, before the event's end.
    await bot.runtime.store.inbox_update("EvX2", state="pending")
    assert await bot.adapter.recover() == 1
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == [GAVE_UP]
    assert llm_server.requests == []  # never run again
    assert await bot.runtime.store.inbox_pending("slack") == []


async def test_deaths_beside_other_events_make_a_suspect_but_never_give_it_up(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    """A slow machine is not a poison event: running in company (or past its
    steps) when the bot died is no evidence against an event."""
    await bot.runtime.receive("slack", "EvB1", "T1:U1", recorded("EvB1", "busy machine"))
    for _ in range(MAX_RESTARTS * 2):
        await bot.runtime.store.inbox_update("EvB1", state="running", alone=False)
        assert [redo.notice for redo in await bot.runtime.inbox.leftovers("slack")] == [""]
        assert bot.runtime.inbox.quarantine.is_suspect("EvB1")
    [entry] = await bot.runtime.store.inbox_pending("slack")
    assert (entry.state, entry.attempts) == ("pending", 0)
    llm_server.set_handler(lambda request: say("still here"))
    assert await bot.adapter.recover() == 1
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == ["still here"]
    assert await bot.runtime.store.inbox_pending("slack") == []
    assert not bot.runtime.inbox.quarantine.is_suspect("EvB1")  # it went through: an ordinary event again


async def test_a_suspect_stays_one_through_kills_before_its_run(bot: SlackBot) -> None:
    """The poison test's 6 deaths: a kill that landed after a start had found
    the suspect, before it ran, cleared the suspicion, and its next death (in
    company again) counted for nothing. Each start here is a fresh process
    (its own Inbox); one kill before the run, then a death while it runs."""
    store = bot.runtime.store
    await bot.runtime.receive("slack", "EvP1", "T1:U1", recorded("EvP1", "poison"))
    await store.inbox_update("EvP1", state="running", alone=False)  # the first death, in company
    event = UserMessage(platform="slack", user_id="T1:U1", text="poison", event_id="EvP1", in_inbox=True)
    deaths = 1
    while not (await Inbox(store).leftovers("slack"))[0].notice:  # a start that is killed before the run
        inbox = Inbox(store)
        await inbox.leftovers("slack")
        assert inbox.quarantine.is_suspect("EvP1")  # ... left it a suspect: it runs alone
        await inbox.started(event)
        deaths += 1  # ... and the bot dies on it
        assert deaths <= MAX_RESTARTS + 1
    assert deaths == MAX_RESTARTS + 1  # the first in company, then MAX_RESTARTS alone


async def test_an_older_message_answered_by_a_newer_events_run_is_not_answered_again(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    """The multi-process harness's case: a newer event ran before a killed
    process's older one was taken over, and the older one's message was
    recorded after the newer one's (by a run killed before it answered). The
    newer event's redo then showed the model both and answered both; the
    older one's replay must not answer its message a second time."""
    await bot.runtime.receive("slack", "EvOld", "T1:U1", recorded("EvOld", "am I late?"))
    await bot.runtime.receive("slack", "EvNew", "T1:U1", recorded("EvNew", "and where do we meet?"))
    agent = await bot.runtime.agent(KEY)
    for event_id, text in (("EvNew", "and where do we meet?"), ("EvOld", "am I late?")):  # recorded out of order
        await agent.record_messages([Message(role="user", content=text, name="user_message", event_id=event_id)])
    llm_server.set_handler(lambda request: say("not late; at the station"))
    redos = {redo.event_id: redo for redo in await bot.runtime.inbox.leftovers("slack")}
    assert await bot.adapter.replay([redos["EvNew"]]) == 1
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == ["not late; at the station"]
    [request] = llm_server.requests
    shown = [text.rsplit("\n", 1)[-1] for text in user_texts(request)]
    assert shown[-2:] == ["and where do we meet?", "am I late?"]  # the newer run saw both
    assert await bot.adapter.replay([redos["EvOld"]]) == 1
    assert len(llm_server.requests) == 1  # the older one's replay did not ask again ...
    assert [m["text"] for m in bot.slack.messages_in("DU1")] == ["not late; at the station"]  # ... nor answer
    assert await bot.runtime.store.inbox_pending("slack") == []
