"""Where each Slack event happened (its Place), the channel context read with
it, and always-on channels: signed Events API payloads over real HTTP into the
real Bolt app, the local fake Web API answering conversations.info, .history
and .replies. A recording bot keeps the events the adapter built."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from adapters.slack import SlackAdapter, SlackConfig
from bot.config import Settings, setting
from bot.errors import ConfigError
from bot.events import Place, Redo, UserMessage
from tests.channel_labels import who_said
from tests.fake_slack import FakeSlack, signature_headers
from tests.recording_bot import RecordingBot
from tests.secrets_catalog import SLACK_TEST_SIGNING_SECRET

ALWAYS_ON = frozenset({"C5", "G5", "G9"})


@dataclass
class Slack:
    adapter: SlackAdapter
    bot: RecordingBot
    api: FakeSlack
    session: aiohttp.ClientSession

    async def event(self, event: dict[str, Any], *, event_id: str = "") -> dict[str, Any]:
        """Post one signed Events API payload; the envelope posted."""
        body = {
            "team_id": "T1",
            "api_app_id": "A1",
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{uuid.uuid4().hex[:12].upper()}",
            "event_time": int(time.time()),
        }
        text = json.dumps(body)
        headers = {"Content-Type": "application/json", **signature_headers(text, SLACK_TEST_SIGNING_SECRET)}
        url = f"http://127.0.0.1:{self.adapter.port}/slack/events"
        async with self.session.post(url, data=text.encode(), headers=headers) as response:
            assert response.status == 200
        return body

    def said(self, channel: str, user: str, text: str, **extra: Any) -> dict[str, Any]:
        """A message posted in `channel` (so the history lists it too), as its event."""
        message = self.api.add_message(channel, user, text, **extra)
        return {**message, "channel": channel, "team": "T1"}

    async def mention(self, channel: str, text: str, *, user: str = "U1", **extra: Any) -> UserMessage:
        """An app_mention (no channel_type: its place comes from conversations.info); its event."""
        before = len(self.bot.messages())
        await self.event({**self.said(channel, user, f"<@UBOT> {text}", **extra), "type": "app_mention"})
        return (await self.bot.wait_for_messages(before + 1))[-1]

    async def message(self, channel: str, channel_type: str, text: str, *, user: str = "U1") -> UserMessage:
        before = len(self.bot.messages())
        await self.event({**self.said(channel, user, text), "channel_type": channel_type})
        return (await self.bot.wait_for_messages(before + 1))[-1]


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack() as api:
        api.add_user("U1", "Alice")
        api.add_user("U2", "Bob")
        api.add_channel("C1", "general")
        api.add_channel("G1", "secret", private=True)
        api.add_channel("C5", "garden")
        api.add_channel("G5", "garden-club", private=True)
        api.add_channel("G9", "mpdm-alice--bob-1", mpim=True)
        yield api


@pytest.fixture
async def slack(fake: FakeSlack) -> AsyncIterator[Slack]:
    bot = RecordingBot()
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    adapter = SlackAdapter(bot, config(fake))
    await adapter.connect()
    yield Slack(adapter, bot, fake, session)
    await adapter.close(grace=5)
    await session.close()


def config(fake: FakeSlack, **overrides: Any) -> SlackConfig:
    settings: dict[str, Any] = {
        "bot_token": fake.bot_token,
        "signing_secret": SLACK_TEST_SIGNING_SECRET,
        "api_url": fake.api_url,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "always_on_channels": ALWAYS_ON,
        "channel_context_messages": 3,
    }
    return SlackConfig(**{**settings, **overrides})


async def test_the_place_comes_from_the_channel_type(slack: Slack) -> None:
    dm = await slack.message("DU1", "im", "hello")
    assert dm.place == Place() and dm.channel_context == []
    group = await slack.message("G5", "group", "in the private channel")
    assert group.place == Place("private", "G5", "#garden-club")
    mpim = await slack.message("G9", "mpim", "in the group DM")
    assert mpim.place == Place("private", "G9", "#mpdm-alice--bob-1")
    public = await slack.message("C5", "channel", "in the public channel")
    assert public.place == Place("public", "C5", "#garden")
    assert public.place.key == "public:C5" and public.channel == "#garden"
    # A DM needs no lookup; each channel's name is looked up once.
    assert sorted(call.args["channel"] for call in slack.api.calls_to("conversations.info")) == ["C5", "G5", "G9"]


async def test_a_mention_without_channel_type_is_placed_by_conversations_info(slack: Slack) -> None:
    public = await slack.mention("C1", "hi")
    assert public.place == Place("public", "C1", "#general")
    private = await slack.mention("G1", "psst")
    assert private.place == Place("private", "G1", "#secret")
    # Slack will not say: private (the safe side), named by its id.
    unknown = await slack.mention("C404", "anyone?")
    assert unknown.place == Place("private", "C404", "C404")
    await slack.mention("C1", "again")
    assert [call.args["channel"] for call in slack.api.calls_to("conversations.info")] == ["C1", "G1", "C404"]


async def test_a_mention_reads_the_lines_before_it_oldest_first(slack: Slack) -> None:
    slack.api.add_message("C1", "U1", "too old to be read")
    slack.api.add_message("C1", "U2", "my tomatoes split, <@U1>")
    slack.api.add_message("C1", "UBOT", "Water them evenly.", bot_id="BBOT")
    slack.api.add_message("C1", "U1", "what do you think?")
    event = await slack.mention("C1", "why do they split?")
    assert event.text == "why do they split?"
    assert [(line.author, line.text, line.from_bot) for line in event.channel_context] == [
        ("Bob", "my tomatoes split, @Alice", False),
        ("memgpt", "Water them evenly.", True),
        ("Alice", "what do you think?", False),
    ]
    # The model is told whose each line is: Alice's own is hers, not "other people's".
    assert who_said(event) == [
        "Bob: my tomatoes split, @Alice",
        "memgpt (a bot): Water them evenly.",
        "Alice (this person): what do you think?",
    ]
    [history] = slack.api.calls_to("conversations.history")
    assert history.args["channel"] == "C1" and history.args["limit"] == "3"
    # Alice's name was looked up for the event, Bob's for his line: once each.
    assert sorted(call.args["user"] for call in slack.api.calls_to("users.info")) == ["U1", "U2"]


async def test_a_thread_reply_shares_its_channels_place_and_reads_the_thread(slack: Slack) -> None:
    parent = slack.api.add_message("C1", "U2", "thread about beans")
    slack.api.add_message("C1", "U2", "said in the channel, not the thread")
    slack.api.add_message("C1", "U2", "beans need a trellis", thread_ts=parent["ts"])
    event = await slack.mention("C1", "how tall?", thread_ts=parent["ts"])
    assert event.place == Place("public", "C1", "#general", thread=parent["ts"])
    assert event.place.key == "public:C1"
    assert [line.text for line in event.channel_context] == ["thread about beans", "beans need a trellis"]
    assert slack.api.calls_to("conversations.history") == []
    [replies] = slack.api.calls_to("conversations.replies")
    assert replies.args["ts"] == parent["ts"]


async def test_a_missing_scope_costs_the_context_not_the_answer(slack: Slack, caplog: pytest.LogCaptureFixture) -> None:
    slack.api.fail("conversations.history", "missing_scope", times=2)
    with caplog.at_level(logging.WARNING):
        first = await slack.mention("C1", "one")
        second = await slack.mention("C1", "two")
    assert first.channel_context == [] and second.channel_context == []
    posts = await slack.api.wait_for("chat.postMessage", 2)
    assert [post.args["text"] for post in posts] == ["<@U1> noted"] * 2
    [warning] = [record.getMessage() for record in caplog.records if "channel context" in record.getMessage()]
    assert "C1" in warning and "missing_scope" in warning and "channels:history" in warning


async def test_every_message_in_an_always_on_channel_is_its_authors_event(slack: Slack) -> None:
    await slack.event({**slack.said("C1", "U1", "not listed, not for the bot"), "channel_type": "channel"})
    event = await slack.message("C5", "channel", "anyone growing leeks?", user="U2")
    assert [message.text for message in slack.bot.messages()] == ["anyone growing leeks?"]
    assert event.user_id == "T1:U2" and event.display_name == "Bob"
    [post] = await slack.api.wait_for("chat.postMessage")
    assert post.args["channel"] == "C5" and post.args["text"] == "<@U2> noted"

    # A mention there arrives twice (message and app_mention, two event ids): one event.
    said = slack.said("C5", "U1", "<@UBOT> and garlic?")
    await slack.event({**said, "channel_type": "channel"})
    await slack.event({**said, "type": "app_mention"})
    await slack.bot.wait_for_messages(2)  # handled after the ack: else "thanks" could count as its arrival
    await slack.message("C5", "channel", "thanks")
    assert [message.text for message in slack.bot.messages()] == ["anyone growing leeks?", "and garlic?", "thanks"]


async def test_a_replayed_mention_gets_the_same_place(slack: Slack, fake: FakeSlack) -> None:
    first = await slack.mention("G1", "remember this")
    payload = slack.bot.payloads[first.event_id]
    assert "channel_type" not in payload["event"]

    again = RecordingBot()
    restarted = SlackAdapter(again, config(fake))  # a new process: nothing cached
    await restarted.connect()
    try:
        await restarted.replay([Redo(first.event_id, payload)])
    finally:
        await restarted.close(grace=5)
    [replayed] = again.messages()
    assert replayed.event_id == first.event_id and replayed.place == first.place == Place("private", "G1", "#secret")


def test_the_settings() -> None:
    env = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s", "SLACK_ALWAYS_ON_CHANNELS": " C5, G5 ,"}
    parsed = SlackConfig.from_env(env)
    assert parsed is not None
    assert parsed.always_on_channels == {"C5", "G5"} and parsed.channel_context_messages == 20
    with pytest.raises(ConfigError, match=r"SLACK_ALWAYS_ON_CHANNELS.*'#general'"):
        SlackConfig.from_env({**env, "SLACK_ALWAYS_ON_CHANNELS": "#general"})
    off = SlackConfig.from_env({**env, "MEMGPT_CHANNEL_CONTEXT_MESSAGES": "0"})
    assert off is not None and off.channel_context_messages == 0
    assert setting({}, "MEMGPT_CHANNEL_CONTEXT_TOKENS") == 1_200
    assert Settings.from_mapping({"MEMGPT_CHANNEL_CONTEXT_MESSAGES": "5"}).channel_context_messages == 5
    for bad in ("-1", "101", "lots"):
        with pytest.raises(ConfigError, match="MEMGPT_CHANNEL_CONTEXT_MESSAGES"):
            Settings.from_mapping({"MEMGPT_CHANNEL_CONTEXT_MESSAGES": bad})
