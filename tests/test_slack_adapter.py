"""The Slack adapter through the real Bolt app: signed Events API payloads over
real HTTP in, the local fake Slack Web API out, a real Runtime on SQLite and
the scripted LLM server in between. Work happens after the ack, so every test
waits for the replies it expects with a bounded poll, and proves that nothing
else arrived by waiting for a later message of the same user (answered in
order, so anything earlier has been dealt with by then)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

from adapters.slack import (
    APOLOGY,
    REPLY_LIMIT,
    SlackAdapter,
    SlackConfig,
)
from adapters.slack.commands import action_id
from adapters.slack.format import markdown_to_mrkdwn, slack_to_plain
from bot.commands.catalog import NOTHING_HELD
from bot.durable.lanes import Turn
from bot.events import Event
from bot.events import Reply as BotReply
from bot.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, InFlightProbe, Reply, fault_status, reply_tool_calls, say, tool_call
from tests.fake_slack import FakeSlack, signature_headers
from tests.helpers import user_texts
from tests.recording_bot import RecordingBot
from tests.secrets_catalog import FAKE_SLACK_APP_TOKEN, SLACK_TEST_SIGNING_SECRET

SECRET = SLACK_TEST_SIGNING_SECRET
_ts = itertools.count(1)


# --------------------------------------------------------------------------- payloads


def next_ts() -> str:
    return f"{int(time.time())}.{next(_ts):06d}"


def dm(text: str, *, user: str = "U1", team: str = "T1", channel: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "channel_type": "im",
        "channel": channel or f"D{user}",
        "user": user,
        "team": team,
        "text": text,
        "ts": next_ts(),
        **extra,
    }


def envelope(event: dict[str, Any], *, team: str = "T1", event_id: str | None = None) -> dict[str, Any]:
    return {
        "token": "legacy-verification-token",
        "team_id": team,
        "api_app_id": "A1",
        "event": event,
        "type": "event_callback",
        "event_id": event_id or f"Ev{uuid.uuid4().hex[:12].upper()}",
        "event_time": int(time.time()),
        "authorizations": [{"team_id": team, "user_id": "UBOT", "is_bot": True}],
    }


def signed(body: str, *, secret: str = SECRET, timestamp: int | None = None) -> dict[str, str]:
    return signature_headers(body, secret, timestamp=timestamp)


async def eventually(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Poll every 20 ms until `condition()` holds; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        if condition():
            return
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def last_user_line(request: dict[str, Any]) -> str:
    return user_texts(request)[-1]


def echo_number(request: dict[str, Any]) -> Reply:
    number = re.findall(r"number (\d+)", last_user_line(request))
    return say(f"reply to {number[-1] if number else '?'}")


# --------------------------------------------------------------------------- harness


@dataclass
class SlackBot:
    adapter: SlackAdapter
    runtime: Runtime  # or any EventPort
    slack: FakeSlack
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.adapter.port}/slack/events"

    async def post(self, body: str, content_type: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        sent = {"Content-Type": content_type, **(headers if headers is not None else signed(body))}
        async with self.session.post(self.url, data=body.encode(), headers=sent) as response:
            return response.status, await response.text()

    async def event(
        self,
        event: dict[str, Any],
        *,
        team: str = "T1",
        event_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> int:
        body = json.dumps(envelope(event, team=team, event_id=event_id))
        return (await self.post(body, "application/json", headers))[0]

    async def command(
        self, command: str, *, user: str = "U1", team: str = "T1", tag: str = "cmd", text: str = ""
    ) -> tuple[int, str]:
        fields = {
            "token": "legacy",
            "team_id": team,
            "team_domain": "test",
            "channel_id": f"D{user}",
            "channel_name": "directmessage",
            "user_id": user,
            "user_name": user.lower(),
            "command": command,
            "text": text,
            "api_app_id": "A1",
            "response_url": self.slack.response_url(tag),
            "trigger_id": "1.2.3",
        }
        return await self.post(urlencode(fields), "application/x-www-form-urlencoded")

    async def click(
        self, action_id: str, *, user: str = "U1", team: str = "T1", tag: str = "click", value: str = "x"
    ) -> tuple[int, str]:
        payload = {
            "type": "block_actions",
            "team": {"id": team, "domain": "test"},
            "user": {"id": user, "username": user.lower(), "team_id": team},
            "api_app_id": "A1",
            "token": "legacy",
            "trigger_id": "1.2.3",
            "response_url": self.slack.response_url(tag),
            "container": {"type": "message", "message_ts": next_ts(), "channel_id": f"D{user}", "is_ephemeral": True},
            "channel": {"id": f"D{user}", "name": "directmessage"},
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": "memgpt_forget",
                    "value": value,
                    "action_ts": next_ts(),
                }
            ],
        }
        return await self.post(urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded")

    async def texts(self, count: int, within: float = 10.0) -> list[str]:
        """The first `count` posted texts, once they have all arrived."""
        calls = await self.slack.wait_for("chat.postMessage", count, within)
        return [str(call.args["text"]) for call in calls]


Start = Callable[..., Awaitable[SlackBot]]


@pytest.fixture
def fake_slack() -> Iterator[FakeSlack]:
    with FakeSlack() as slack:
        for user, name in (("U1", "Alice"), ("U2", "Bob"), ("U3", "Carol")):
            slack.add_user(user, name)
        slack.add_channel("C1", "general")
        yield slack


@pytest.fixture
async def start_bot(make_runtime: RuntimeFactory, fake_slack: FakeSlack) -> AsyncIterator[Start]:
    adapters: list[SlackAdapter] = []
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    async def start(runtime: Any = None, **overrides: Any) -> SlackBot:
        runtime = runtime or await make_runtime()
        settings: dict[str, Any] = {
            "bot_token": fake_slack.bot_token,
            "signing_secret": SECRET,
            "api_url": fake_slack.api_url,
            "http_host": "127.0.0.1",
            "http_port": 0,
        }
        adapter = SlackAdapter(runtime, SlackConfig(**{**settings, **overrides}))
        adapters.append(adapter)
        await adapter.connect()
        return SlackBot(adapter, runtime, fake_slack, session)

    yield start
    for adapter in adapters:
        await adapter.close(grace=5)
    await session.close()


@pytest.fixture
async def bot(start_bot: Start) -> SlackBot:
    return await start_bot()


# --------------------------------------------------------------------------- messages


async def test_a_dm_reaches_the_senders_agent_and_is_answered_in_the_same_channel(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    llm_server.script(say("Hello Alice!"), say("In the thread."))
    assert await bot.event(dm("hi there <@U2>, &lt;3", channel="D42")) == 200
    [post] = await bot.slack.wait_for("chat.postMessage")
    assert post.args["channel"] == "D42" and post.args["text"] == "Hello Alice!"
    assert "thread_ts" not in post.args
    assert post.headers["Authorization"] == f"Bearer {bot.slack.bot_token}"
    assert await bot.runtime.store.find_agent("slack:T1:U1") is not None
    # The display name comes from users.info; Slack's markup reaches the model as plain text.
    assert last_user_line(llm_server.requests[0]).endswith("Alice: hi there @U2, <3")

    await bot.event(dm("and in a thread", channel="D42", thread_ts="1700000000.000001"))
    posts = await bot.slack.wait_for("chat.postMessage", 2)
    assert posts[1].args["thread_ts"] == "1700000000.000001" and posts[1].args["text"] == "In the thread."
    assert len(bot.slack.calls_to("users.info")) == 1  # the name is cached


async def test_an_app_mention_is_answered_in_its_thread_mentioning_the_author(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    llm_server.script(say("Sure thing."))
    mention = {
        "type": "app_mention",
        "channel": "C1",
        "user": "U2",
        "team": "T1",
        "ts": "1700000000.000200",
        "text": "<@UBOT> can you help?",
    }
    assert await bot.event(mention) == 200
    [post] = await bot.slack.wait_for("chat.postMessage")
    metadata = post.args.pop("metadata")
    assert post.args == {"channel": "C1", "thread_ts": "1700000000.000200", "text": "<@U2> Sure thing."}
    # The reply names its outbox entry, so a resend after a crash can tell it was posted.
    assert metadata["event_type"] == "memgpt_reply" and metadata["event_payload"]["part"] == 0
    assert last_user_line(llm_server.requests[0]).endswith("Bob in #general: can you help?")
    assert await bot.runtime.store.find_agent("slack:T1:U2") is not None


async def test_a_retried_delivery_is_answered_once(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(echo_number)
    first = envelope(dm("number 1"), event_id="EvRETRY1")
    body = json.dumps(first)
    assert (await bot.post(body, "application/json"))[0] == 200
    retry = {**signed(body), "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
    assert (await bot.post(body, "application/json", retry))[0] == 200
    await bot.event(dm("number 2"))
    assert await bot.texts(2) == ["reply to 1", "reply to 2"]
    assert len(llm_server.requests) == 2
    await bot.adapter.drain()
    assert len(bot.slack.calls_to("chat.postMessage")) == 2


async def test_forged_and_stale_requests_are_rejected_and_reach_no_agent(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    body = json.dumps(envelope(dm("let me in")))
    forged = signed(body, secret="not-the-signing-secret")
    stale = signed(body, timestamp=int(time.time()) - 6 * 60)
    for headers in (forged, stale, {}):
        status, _ = await bot.post(body, "application/json", headers)
        assert status == 401
    llm_server.script(say("Hi Bob."))
    await bot.event(dm("hello", user="U2"))
    assert await bot.texts(1) == ["Hi Bob."]
    assert len(llm_server.requests) == 1
    assert await bot.runtime.store.find_agent("slack:T1:U1") is None


async def test_the_bots_own_messages_edits_and_other_bots_are_ignored(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    ignored = [
        dm("my own reply", user="UBOT"),
        {**dm("from another bot"), "bot_id": "B999"},
        {**dm("legacy bot"), "subtype": "bot_message", "bot_id": "B999"},
        {**dm(""), "subtype": "message_changed", "message": {"text": "edited", "user": "U1"}},
        {**dm(""), "subtype": "message_deleted", "deleted_ts": "1.2"},
        {**dm("said in a channel"), "channel_type": "channel", "channel": "C1"},
    ]
    for event in ignored:
        assert await bot.event(event) == 200
    llm_server.script(say("Only this one."))
    await bot.event(dm("a real message"))
    assert await bot.texts(1) == ["Only this one."]
    await bot.adapter.drain()
    assert len(llm_server.requests) == 1
    assert "a real message" in last_user_line(llm_server.requests[0])


async def test_the_same_user_id_in_two_workspaces_has_two_memories(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    def model(request: dict[str, Any]) -> Reply:
        if "my favourite music is jazz" in last_user_line(request):
            return reply_tool_calls(
                tool_call(
                    "core_memory_append", {"name": "human", "content": "Loves jazz.", "request_heartbeat": False}
                ),
                tool_call("send_message", {"message": "Noted!"}),
            )
        # Known in its working context: the edit's call and result in the queue until the
        # next flush puts it in the system message (memory/queue_manager.py); never in T2's.
        knows = "Loves jazz." in json.dumps(request["messages"])
        return say("You love jazz." if knows else "I don't know your taste yet.")

    llm_server.set_handler(model)
    await bot.event(dm("my favourite music is jazz", team="T1"), team="T1")
    assert await bot.texts(1) == ["Noted!"]
    await bot.event(dm("what music do I like?", team="T2"), team="T2")
    assert (await bot.texts(2))[1] == "I don't know your taste yet."
    await bot.event(dm("what music do I like?", team="T1"), team="T1")
    assert (await bot.texts(3))[2] == "You love jazz."
    one, two = await bot.runtime.agent("slack:T1:U1"), await bot.runtime.agent("slack:T2:U1")
    assert one.id != two.id


async def test_the_http_ack_returns_before_the_model_answers(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    acked, answered = threading.Event(), threading.Event()

    def model(request: dict[str, Any]) -> Reply:
        # Blocks the model until the test has seen the HTTP response: an ack that
        # waited for the model would time out here instead.
        in_time = acked.wait(10)
        answered.set()
        return say("answered after the ack" if in_time else "the ack waited for me")

    llm_server.set_handler(model)
    started = time.monotonic()
    assert await bot.event(dm("hello")) == 200
    assert time.monotonic() - started < 2 and not answered.is_set()
    acked.set()
    assert await bot.texts(1) == ["answered after the ack"]


async def test_one_users_messages_are_answered_in_order(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    probe = InFlightProbe(echo_number)
    llm_server.set_handler(probe)
    # Back to back, as Slack delivers them: each request returns at its ack, long before any answer.
    for number in range(10):
        assert await bot.event(dm(f"number {number}")) == 200
    assert await bot.texts(10) == [f"reply to {number}" for number in range(10)]
    assert probe.most == 1


async def test_different_users_are_served_concurrently(
    start_bot: Start, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # Each answer waits until three requests are in flight at once: users served one by one break the barrier.
    barrier = threading.Barrier(3, timeout=10)

    def model(request: dict[str, Any]) -> Reply:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return fault_status(500, body="users were not served concurrently", headers={"x-should-retry": "false"})
        return echo_number(request)

    llm_server.set_handler(model)
    bot = await start_bot(await make_runtime(llm_max_retries=0))
    for number, user in enumerate(("U1", "U2", "U3")):
        await bot.event(dm(f"number {number}", user=user))
    posts = await bot.slack.wait_for("chat.postMessage", 3)
    assert {(post.args["channel"], post.args["text"]) for post in posts} == {
        ("DU1", "reply to 0"),
        ("DU2", "reply to 1"),
        ("DU3", "reply to 2"),
    }


# --------------------------------------------------------------------------- replies


async def test_a_long_reply_is_split_in_order_and_markdown_becomes_mrkdwn(
    start_bot: Start, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    long = "\n\n".join(f"**Part {i}.** " + " ".join(["lorem ipsum dolor sit amet"] * 20) for i in range(20))
    styled = "# Plan\n**Water** the [garden](https://example.com/g?a=1&b=2) & rest < 5 min"
    llm_server.script(
        reply_tool_calls(tool_call("send_message", {"message": long}), tool_call("send_message", {"message": styled}))
    )
    # A model allowed answers this long (the bot reads an answer no further than twice its max_tokens).
    bot = await start_bot(await make_runtime(response_reserve=1600, context_window=16_384))
    await bot.event(dm("tell me everything"))
    await bot.adapter.drain()
    texts = await bot.texts(1)
    *chunks, last = texts
    assert len(chunks) >= 4 and all(len(chunk) <= REPLY_LIMIT for chunk in chunks)
    assert "\n\n".join(chunks) == markdown_to_mrkdwn(long)
    assert [int(n) for n in re.findall(r"\*Part (\d+)\.\*", "".join(chunks))] == list(range(20))
    assert last == "*Plan*\n*Water* the <https://example.com/g?a=1&amp;b=2|garden> &amp; rest &lt; 5 min"


async def test_failed_sends_are_logged_and_the_bot_carries_on(
    bot: SlackBot, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.set_handler(echo_number)
    bot.slack.fail("chat.postMessage", "channel_not_found")
    with caplog.at_level(logging.ERROR, logger="adapters.slack"):
        await bot.event(dm("number 1"))
        bot_calls = await bot.slack.wait_for("chat.postMessage")
        await bot.adapter.drain()
    assert "chat.postMessage to DU1 failed: channel_not_found" in caplog.text
    assert len(bot_calls) == 1
    # A rate-limited post is retried after Retry-After.
    bot.slack.rate_limit("chat.postMessage", retry_after=0)
    await bot.event(dm("number 2"))
    posts = await bot.slack.wait_for("chat.postMessage", 3)
    assert [post.args["text"] for post in posts] == ["reply to 1", "reply to 2", "reply to 2"]
    await bot.event(dm("number 3"))
    assert (await bot.texts(4))[3] == "reply to 3"


async def test_joins_are_answered_in_a_direct_message(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(lambda request: say("Welcome!") if "joined" in last_user_line(request) else say("?"))
    newcomer = {
        "id": "U7",
        "team_id": "T1",
        "name": "dana",
        "real_name": "Dana Scully",
        "profile": {"display_name": "Dana", "real_name": "Dana Scully"},
        "is_bot": False,
    }
    await bot.event({"type": "team_join", "user": newcomer, "event_ts": next_ts()})
    await bot.event(
        {
            "type": "member_joined_channel",
            "user": "UBOT",
            "channel": "C1",
            "channel_type": "C",
            "team": "T1",
            "event_ts": next_ts(),
        }
    )
    await bot.event(
        {
            "type": "member_joined_channel",
            "user": "U1",
            "channel": "C1",
            "channel_type": "C",
            "team": "T1",
            "event_ts": next_ts(),
        }
    )
    posts = await bot.slack.wait_for("chat.postMessage", 2)
    assert sorted(post.args["channel"] for post in posts) == ["DU1", "DU7"]
    await bot.adapter.drain()
    lines = sorted(last_user_line(request) for request in llm_server.requests)
    assert len(lines) == 2
    assert lines[0].endswith("Alice joined #general.")
    assert lines[1].endswith("Dana joined the Test Team Slack workspace.")
    assert {call.args["users"] for call in bot.slack.calls_to("conversations.open")} == {"U1", "U7"}


async def test_an_error_in_the_bot_gets_an_apology_and_the_next_message_an_answer(start_bot: Start) -> None:
    class FlakyBot(RecordingBot):
        calls = 0

        async def handle(self, event: Event, turn: Turn | None = None) -> list[BotReply]:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("the database went away")
            return [event.reply("back again")]

    bot = await start_bot(FlakyBot())
    await bot.event(dm("first"))
    await bot.event(dm("second"))
    assert await bot.texts(2) == [APOLOGY, "back again"]


async def test_slack_can_verify_the_request_url(bot: SlackBot) -> None:
    status, text = await bot.post(
        json.dumps({"token": "t", "challenge": "c4ll3ng3", "type": "url_verification"}), "application/json"
    )
    assert status == 200 and json.loads(text) == {"challenge": "c4ll3ng3"}


async def test_close_lets_answers_in_flight_finish_and_ends_start(
    make_runtime: RuntimeFactory, fake_slack: FakeSlack, llm_server: FakeLLMServer
) -> None:
    release = threading.Event()
    llm_server.set_handler(lambda request: say("finished" if release.wait(10) else "never released"))
    config = SlackConfig(
        bot_token=fake_slack.bot_token,
        signing_secret=SECRET,
        api_url=fake_slack.api_url,
        http_host="127.0.0.1",
        http_port=0,
    )
    adapter = SlackAdapter(await make_runtime(), config)
    running = asyncio.create_task(adapter.start())
    await eventually(lambda: adapter.port is not None or running.done())
    port = adapter.port
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        bot = SlackBot(adapter, adapter.bot, fake_slack, session)  # type: ignore[arg-type]
        assert await bot.event(dm("take your time")) == 200
        await eventually(lambda: bool(llm_server.requests))
        closing = asyncio.create_task(adapter.close(grace=10))
        await eventually(lambda: adapter.port is None)  # no longer listening...
        assert not closing.done()  # ...but still waiting for the answer in flight
        release.set()
        await closing
        await running  # start() returns once closed
        assert fake_slack.posted_texts() == ["finished"]
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.post(f"http://127.0.0.1:{port}/slack/events", data=b"{}")


# --------------------------------------------------------------------------- commands


async def test_memory_command_answers_privately(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    assert await bot.command("/memory", tag="before") == (200, "")
    [empty] = await bot.slack.wait_for("response_url")
    assert empty.args["response_type"] == "ephemeral"
    assert empty.args["text"] == NOTHING_HELD

    llm_server.script(
        reply_tool_calls(
            tool_call(
                "core_memory_append",
                {"name": "human", "content": "Loves jazz & <b>blues</b>.", "request_heartbeat": False},
            ),
            tool_call("send_message", {"message": "Noted!"}),
        )
    )
    await bot.event(dm("I love jazz and blues"))
    await bot.texts(1)
    await bot.command("/memory", tag="after")
    report = (await bot.slack.wait_for("response_url", 2))[1]
    assert report.args["tag"] == "after" and report.args["response_type"] == "ephemeral"
    assert report.args["text"].startswith("What I hold on you: ")
    blocks = report.args["blocks"]
    [at] = [n for n, block in enumerate(blocks) if block["type"] == "section" and "jazz" in block["text"]["text"]]
    assert "Note: Loves jazz &amp; &lt;b&gt;blues&lt;/b&gt;. (learned in your DMs, " in blocks[at]["text"]["text"]
    button, share = blocks[at + 1]["elements"]  # the note's buttons, under it
    assert button["action_id"] == action_id("forget_item") and button["text"]["text"] == "Forget this"
    assert (
        share["action_id"] == action_id("share_item") and share["value"] == button["value"]
    )  # a DM note may be shared

    # The button forgets that one note, for whoever clicks it.
    assert (await bot.click(action_id("forget_item"), tag="item", value=button["value"]))[0] == 200
    answer = (await bot.slack.wait_for("response_url", 3))[2]
    assert answer.args["text"].startswith("Forgotten: 0 messages, 0 saved passages, 1 note")
    agent = await bot.runtime.store.find_agent("slack:T1:U1")
    assert agent is not None
    assert "jazz" not in " ".join(block.value for block in await bot.runtime.store.load_blocks(agent.id))
    # The text command does the same, and says so when the id is gone.
    await bot.command("/memory", tag="again", text=f"forget {button['value']}")
    again = (await bot.slack.wait_for("response_url", 4))[3]
    assert again.args["text"].startswith("No item")
    # `/memory search` searches as the agent does (the message is still held); a generous bound: the
    # first search of the session waits for the embedding model to load.
    await bot.command("/memory", tag="search", text="search jazz")
    found = (await bot.slack.wait_for("response_url", 5, within=180))[4]
    assert found.args["text"].startswith("Best matches for 'jazz'") and "I love jazz and blues" in found.args["text"]


async def test_forget_command_asks_first_and_the_button_forgets(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    llm_server.script(say("Hi!"))
    await bot.event(dm("remember me"))
    await bot.texts(1)

    assert await bot.command("/forget", tag="ask") == (200, "")
    [question] = await bot.slack.wait_for("response_url")
    assert question.args["response_type"] == "ephemeral"
    buttons = [
        element for block in question.args["blocks"] if block["type"] == "actions" for element in block["elements"]
    ]
    assert [button["action_id"] for button in buttons] == [action_id("forget_confirm"), action_id("forget_cancel")]

    assert (await bot.click(action_id("forget_cancel"), tag="cancel"))[0] == 200
    cancelled = (await bot.slack.wait_for("response_url", 2))[1]
    assert cancelled.args["replace_original"] is True and "Cancelled" in cancelled.args["text"]
    assert await bot.runtime.store.find_agent("slack:T1:U1") is not None

    assert (await bot.click(action_id("forget_confirm"), tag="confirm"))[0] == 200
    done = (await bot.slack.wait_for("response_url", 3))[2]
    assert done.args["replace_original"] is True and "forgotten everything" in done.args["text"]
    assert await bot.runtime.store.find_agent("slack:T1:U1") is None


async def test_forget_about_shows_the_matches_and_the_button_forgets_them(
    bot: SlackBot, llm_server: FakeLLMServer
) -> None:
    llm_server.script(
        reply_tool_calls(
            tool_call("archival_memory_insert", {"content": "Allergic to penicillin.", "request_heartbeat": False}),
            tool_call("send_message", {"message": "Noted."}),
        ),
        say("Nice weather."),
    )
    await bot.event(dm("I am allergic to penicillin"))
    await bot.event(dm("the weather is nice"))
    await bot.texts(2)

    assert await bot.command("/forget", tag="ask", text="about: penicillin") == (200, "")
    [question] = await bot.slack.wait_for("response_url", within=60)
    assert question.args["response_type"] == "ephemeral"
    assert (
        "About 'penicillin' I hold " in question.args["text"]
        and "Saved: Allergic to penicillin." in question.args["text"]
    )
    buttons = [
        element for block in question.args["blocks"] if block["type"] == "actions" for element in block["elements"]
    ]
    assert [button["action_id"] for button in buttons] == [action_id("forget_about"), action_id("forget_cancel")]
    agent = await bot.runtime.store.find_agent("slack:T1:U1")
    assert agent is not None and await bot.runtime.store.count_passages(agent.id) == 1  # nothing deleted yet

    assert (await bot.click(action_id("forget_about"), tag="confirm", value=buttons[0]["value"]))[0] == 200
    done = (await bot.slack.wait_for("response_url", 2, within=60))[1]
    assert done.args["replace_original"] is True and done.args["text"].startswith("Forgotten: ")
    assert "1 saved passage" in done.args["text"]
    assert await bot.runtime.store.count_passages(agent.id) == 0
    left = [m.searchable_text() for m in await bot.runtime.store.messages_since(agent.id, 0)]
    assert left and not [text for text in left if "penicillin" in text.lower()]
    assert any("weather" in text for text in left)


async def test_checkin_command_manages_check_ins_delivered_to_the_dm(start_bot: Start) -> None:
    class CheckinBot(RecordingBot):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, str, str, dict[str, Any]]] = []

        async def checkin_command(self, platform: str, user_id: str, text: str, reply_to: dict[str, Any]) -> str:
            self.calls.append((platform, user_id, text, reply_to))
            return "Check-in #1: **daily** at 09:00 <Europe/Paris>"

    checkins = CheckinBot()
    bot = await start_bot(checkins)
    fields = {
        "token": "t",
        "team_id": "T1",
        "channel_id": "C1",
        "user_id": "U1",
        "command": "/checkin",
        "text": " daily 09:00 water the plants ",
        "response_url": bot.slack.response_url("checkin"),
    }
    assert await bot.post(urlencode(fields), "application/x-www-form-urlencoded") == (200, "")
    [answer] = await bot.slack.wait_for("response_url")
    assert answer.args["response_type"] == "ephemeral"
    assert answer.args["text"] == "Check-in #1: *daily* at 09:00 &lt;Europe/Paris&gt;"
    assert checkins.calls == [("slack", "T1:U1", "daily 09:00 water the plants", {"dm_user": "U1"})]


async def test_close_waits_for_command_answers_under_way_then_cuts_the_rest_short(start_bot: Start) -> None:
    class SlowCheckins(RecordingBot):
        """`/checkin slow` answers after a moment; `/checkin stuck` never does."""

        def __init__(self) -> None:
            super().__init__()
            self.started: list[str] = []
            self.cancelled: list[str] = []

        async def checkin_command(self, platform: str, user_id: str, text: str, reply_to: dict[str, Any]) -> str:
            self.started.append(text)
            try:
                await asyncio.sleep(0.3 if text == "slow" else 3600)
            except asyncio.CancelledError:
                self.cancelled.append(text)
                raise
            return f"answered {text}"

    checkins = SlowCheckins()
    bot = await start_bot(checkins)
    for text in ("slow", "stuck"):
        assert await bot.command("/checkin", tag=text, text=text) == (200, "")
    deadline = time.monotonic() + 10
    while len(checkins.started) < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)

    started = time.monotonic()
    await bot.adapter.close(grace=1.0)
    assert time.monotonic() - started < 3  # bounded: the stuck one does not hold shutdown
    # The answer under way was sent before close returned; the stuck one was cancelled, unanswered.
    assert [call.args["text"] for call in bot.slack.calls_to("response_url")] == ["answered slow"]
    assert checkins.cancelled == ["stuck"]


# --------------------------------------------------------------------------- files


async def test_a_shared_markdown_file_is_saved_to_memory(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    handbook = "# Watering\n\nWater tomatoes at dawn, never at noon.\n\n# Soil\n\nUse compost rich in nitrogen."
    shared = bot.slack.add_file("garden.md", handbook, mimetype="text/markdown", filetype="markdown")
    check_later = {"id": bot.slack.add_file("notes.txt", "Basil likes sun.")["id"], "file_access": "check_file_info"}
    llm_server.set_handler(lambda request: say("Thanks for the notes!"))
    await bot.event(dm("", subtype="file_share", files=[shared, check_later]))
    # A generous bound: the first upload of the session waits for the embedding model to load.
    assert await bot.texts(4, within=60) == [
        "Saved garden.md to my memory (2 passages).",
        "Thanks for the notes!",
        "Saved notes.txt to my memory (1 passage).",
        "Thanks for the notes!",
    ]
    downloads = bot.slack.calls_to("file_download")
    assert len(downloads) == 2 and all(d.headers["Authorization"] == f"Bearer {bot.slack.bot_token}" for d in downloads)
    assert [call.args["file"] for call in bot.slack.calls_to("files.info")] == [check_later["id"]]
    assert "uploaded the file 'garden.md'" in last_user_line(llm_server.requests[0])


async def test_unsupported_and_oversized_files_are_refused(start_bot: Start, llm_server: FakeLLMServer) -> None:
    bot = await start_bot(max_upload_bytes=64)
    tool = bot.slack.add_file("tool.exe", b"MZ\x90\x00", mimetype="application/octet-stream", filetype="binary")
    big = bot.slack.add_file("big.txt", "x" * 100)
    liar = {**bot.slack.add_file("liar.txt", "y" * 100), "size": 10}  # more bytes than announced
    await bot.event(dm("", subtype="file_share", files=[tool, big, liar]))
    assert await bot.texts(3) == [
        "I can only read text (.txt), Markdown (.md), HTML and PDF files, so I didn't save tool.exe.",
        "big.txt is too large: I can read files of up to 64 bytes.",
        "liar.txt is too large: I can read files of up to 64 bytes.",
    ]
    assert len(bot.slack.calls_to("file_download")) == 1  # only the one that lied about its size
    assert llm_server.requests == []


async def test_a_shared_html_file_is_saved_like_on_discord(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    # One list of readable types for both adapters (bot/ports.py: readable); Slack once refused HTML.
    llm_server.set_handler(lambda request: say("Thanks for the page!"))
    page = bot.slack.add_file(
        "page.html", "<html><body><h1>Garden</h1><p>Basil likes sun.</p></body></html>", mimetype="text/html"
    )
    await bot.event(dm("", subtype="file_share", files=[page]))
    assert await bot.texts(2, within=60) == ["Saved page.html to my memory (1 passage).", "Thanks for the page!"]


# --------------------------------------------------------------------------- Socket Mode


async def test_socket_mode_runs_the_same_handlers(start_bot: Start, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(echo_number)
    bot = await start_bot(app_token=FAKE_SLACK_APP_TOKEN, signing_secret=None)
    assert bot.adapter.port is None
    await bot.slack.wait_for("socket_mode.connect")
    payload = envelope(dm("number 1"), event_id="EvSOCKET1")
    first = bot.slack.send_socket_event(payload)
    second = bot.slack.send_socket_event(payload, retry_attempt=1, retry_reason="timeout")
    bot.slack.send_socket_event(envelope(dm("number 2")))
    assert await bot.texts(2) == ["reply to 1", "reply to 2"]
    acks = {call.args["envelope_id"] for call in await bot.slack.wait_for("socket_mode.ack", 3)}
    assert {first, second} <= acks
    assert len(llm_server.requests) == 2
    assert len(bot.slack.calls_to("apps.connections.open")) == 1


# --------------------------------------------------------------------------- configuration and secrets


def test_config_from_env() -> None:
    assert SlackConfig.from_env({}) is None
    with pytest.raises(ValueError, match=r"SLACK_APP_TOKEN .* or SLACK_SIGNING_SECRET"):
        SlackConfig.from_env({"SLACK_BOT_TOKEN": "xoxb-1"})
    with pytest.raises(ValueError, match="starts with xoxb-"):
        SlackConfig.from_env({"SLACK_BOT_TOKEN": "xoxp-user-token", "SLACK_APP_TOKEN": "xapp-1"})
    with pytest.raises(ValueError, match="SLACK_SIGNING_SECRET"):
        SlackConfig(bot_token="xoxb-1")  # HTTP mode without a secret would accept unsigned requests
    with pytest.raises(ValueError, match="SLACK_HTTP_PORT"):
        SlackConfig.from_env({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s", "SLACK_HTTP_PORT": "http"})
    socket = SlackConfig.from_env(
        {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "SLACK_SIGNING_SECRET": ""}
    )
    assert socket is not None and socket.socket_mode and socket.signing_secret is None
    http = SlackConfig.from_env(
        {
            "SLACK_BOT_TOKEN": "xoxb-secret-token",
            "SLACK_SIGNING_SECRET": "shh",
            "SLACK_API_URL": "http://127.0.0.1:9/api/",
            "SLACK_HTTP_PORT": "8080",
            "SLACK_MAX_UPLOAD_BYTES": "1000",
        }
    )
    assert http is not None and not http.socket_mode
    assert (http.http_host, http.http_port, http.max_upload_bytes, http.api_url) == (
        "0.0.0.0",
        8080,
        1000,
        "http://127.0.0.1:9/api/",
    )
    assert "xoxb-secret-token" not in repr(http) and "shh" not in repr(http)


async def test_bad_credentials_fail_at_start_without_showing_them(start_bot: Start) -> None:
    with pytest.raises(RuntimeError, match=r"SLACK_BOT_TOKEN \(auth.test: invalid_auth\)") as bad_bot:
        await start_bot(bot_token="xoxb-wrong-token")
    with pytest.raises(RuntimeError, match=r"SLACK_APP_TOKEN \(apps.connections.open: invalid_auth\)") as bad_app:
        await start_bot(app_token="xapp-wrong-token", signing_secret=None)
    assert "wrong-token" not in str(bad_bot.value) + str(bad_app.value)
    with pytest.raises(OSError):  # the port is taken
        await start_bot(http_port=(await start_bot()).adapter.port)


async def test_no_token_or_secret_reaches_the_logs(
    bot: SlackBot, llm_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.set_handler(lambda request: say("ok"))
    shared = bot.slack.add_file("a.md", "# A\n\nalpha")
    with caplog.at_level(logging.DEBUG):
        await bot.post(json.dumps(envelope(dm("forged"))), "application/json", signed("x", secret="wrong"))
        await bot.event(dm("", subtype="file_share", files=[shared]))
        await bot.event(dm("hello"))
        await bot.texts(3, within=60)
        await bot.adapter.drain()
    assert caplog.records
    assert bot.slack.bot_token not in caplog.text and SECRET not in caplog.text


# --------------------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __also__", "*bold* and *also*"),
        ("*italic* and _italic_ and ~~gone~~", "_italic_ and _italic_ and ~gone~"),
        ("[text](https://a.b/c?x=1&y=2)", "<https://a.b/c?x=1&amp;y=2|text>"),
        ("[**bold label**](https://a.b)", "<https://a.b|bold label>"),
        ("<https://a.b> and ![alt](https://i/p.png)", "<https://a.b> and <https://i/p.png|alt>"),
        ("## Heading **x**\ntext", "*Heading x*\ntext"),
        ("a < b & c > d <!channel>", "a &lt; b &amp; c &gt; d &lt;!channel&gt;"),
        ("- one\n* two\n  + three", "• one\n• two\n  • three"),
        ("> quoted & kept", "> quoted &amp; kept"),
        ("2 * 3 * 4 and snake_case_name", "2 * 3 * 4 and snake_case_name"),
        ("use `**x** < y` here", "use `**x** &lt; y` here"),
        ("```python\nif a < b:\n    print('**no**')\n```", "```\nif a &lt; b:\n    print('**no**')\n```"),
        ("cut off\n```js\nlet x = 1 < 2", "cut off\n```\nlet x = 1 &lt; 2\n```"),
        ("---", "──────────"),
        ("[pipe](https://x.y/?q=a|b)", "<https://x.y/?q=a%7Cb|pipe>"),
    ],
)
def test_markdown_to_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert markdown_to_mrkdwn(markdown) == mrkdwn


def test_slack_markup_to_plain_text() -> None:
    names = {"U2": "bob"}.get
    text = "<@UBOT> hi <@U2> <@U3|carol> in <#C1|general> see <https://x.y|site> <https://z.w> &lt;3 &amp; <!here>"
    plain = "@UBOT hi @bob @carol in #general see site (https://x.y) https://z.w <3 & @here"
    assert slack_to_plain(text, names) == plain
    assert slack_to_plain("<mailto:a@b.c|a@b.c> <!subteam^S1|@ops> <!date^1^{date}|Jan 1>") == "a@b.c @ops Jan 1"
