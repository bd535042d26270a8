"""Listening channels on Slack, through the real Bolt app (signed Events API
payloads over HTTP, the fake Slack Web API) and a real Runtime on SQLite: a
`listen` channel keeps every person's line before Slack is acknowledged and
answers only mentions, with no LLM call for the rest; re-deliveries keep a
line once; edits and deletions apply; the notice is said once; `/channel`
shows and sets the mode for managers only; a restart keeps lines and mode; an
opted-out speaker is not kept."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest

from adapters.channels import default_mode
from adapters.slack import SlackConfig
from adapters.slack.format import time_of
from bot.channels.listening import LISTENING_NOTICE
from bot.channels.port import ChannelRef
from bot.commands.catalog import CHANNEL_IN_DM, CHANNEL_NOT_MANAGER
from bot.errors import ConfigError
from bot.events import Place
from tests import test_slack_adapter as slack_tests
from tests.fake_llm import FakeLLMServer, say
from tests.fake_slack import FakeSlack
from tests.test_slack_adapter import SlackBot, Start, envelope, eventually, next_ts

fake_slack = slack_tests.fake_slack
start_bot = slack_tests.start_bot

ALICE, BOB, CAROL = "slack:T1:U1", "slack:T1:U2", "slack:T1:U3"
GENERAL = ChannelRef("slack", "T1", Place("public", "C1"))


def said(text: str, *, user: str = "U1", channel: str = "C1", ts: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "channel": channel,
        "channel_type": "channel",
        "user": user,
        "team": "T1",
        "text": text,
        "ts": ts or next_ts(),
        **extra,
    }


async def mention(bot: SlackBot, text: str, *, user: str = "U2") -> str:
    """A mention arrives twice, as Slack sends it: a message event and an app_mention."""
    message = said(f"<@UBOT> {text}", user=user)
    assert await bot.event(message) == 200
    assert await bot.event(message | {"type": "app_mention"}) == 200
    return str(message["ts"])


def notices(slack: FakeSlack) -> list[str]:
    return [
        call.args["channel"] for call in slack.calls_to("chat.postMessage") if call.args["text"] == LISTENING_NOTICE
    ]


async def command(bot: SlackBot, text: str, *, user: str, channel: str = "C1", tag: str = "channel") -> str:
    """`/channel text` typed by `user` in `channel`; the answer only they see."""
    fields = {
        "team_id": "T1",
        "channel_id": channel,
        "channel_name": "general" if channel == "C1" else "directmessage",
        "user_id": user,
        "command": "/channel",
        "text": text,
        "api_app_id": "A1",
        "response_url": bot.slack.response_url(tag),
        "trigger_id": "1.2.3",
    }
    before = len(bot.slack.calls_to("response_url"))
    status, _ = await bot.post(urlencode(fields), "application/x-www-form-urlencoded")
    assert status == 200
    calls = await bot.slack.wait_for("response_url", before + 1)
    return str(calls[before].args["text"])


async def test_a_listening_channel_keeps_every_line_before_the_ack_and_answers_only_mentions(
    start_bot: Start, llm_server: FakeLLMServer
) -> None:
    bot = await start_bot(listen_channels=frozenset({"C1"}))
    memory = bot.runtime.channel_memory
    llm_server.script(say("It moved to May 3."))
    first = said("The launch moves to May 3, code name Bluebird.")
    assert await bot.event(first) == 200
    # Kept before Slack was acknowledged: the line is there as the HTTP answer arrives.
    [line] = await memory.speaker_lines(ALICE)
    assert (line.text, line.speaker, line.speaker_name) == (
        "The launch moves to May 3, code name Bluebird.",
        ALICE,
        "Alice",
    )
    assert (line.channel, line.place, line.message_id) == ("slack:T1:C1", "public:C1", first["ts"])
    assert line.said_at == time_of(first["ts"])
    assert await bot.event(said("sounds good", user="U2", thread_ts=first["ts"])) == 200  # a thread is its channel's
    ts = await mention(bot, "when is the launch?")

    posts = await bot.texts(2)
    assert sorted(posts) == sorted([LISTENING_NOTICE, "<@U2> It moved to May 3."])
    assert len(llm_server.requests) == 1  # only the mention: listening makes no LLM call
    bobs = await memory.speaker_lines(BOB)
    assert [line.text for line in bobs] == ["sounds good", "@UBOT when is the launch?"]  # the mention kept once
    assert bobs[1].message_id == ts

    assert await bot.event(said("and the venue is the old mill")) == 200
    await bot.adapter.pipeline.drain()  # a notice would be posted from a task of the pipeline's
    assert [x.text for x in await memory.speaker_lines(ALICE)][-1] == "and the venue is the old mill"
    assert notices(bot.slack) == ["C1"]  # said once
    assert len(llm_server.requests) == 1
    # Nothing heard reached anyone's agent: only bob's, for his mention.
    assert await bot.runtime.store.find_agent(ALICE) is None


async def test_a_redelivery_keeps_a_line_once_and_a_failure_to_keep_leaves_it_unacknowledged(
    start_bot: Start, llm_server: FakeLLMServer
) -> None:
    bot = await start_bot(listen_channels=frozenset({"C1"}))
    memory = bot.runtime.channel_memory
    body = json.dumps(envelope(said("the budget is 40k"), event_id="EvOnce"))
    keep = memory.keep

    async def failing(line: Any) -> bool:
        raise OSError("disk full")

    memory.keep = failing  # type: ignore[method-assign]
    status, _ = await bot.post(body, "application/json")
    assert status != 200  # Slack delivers it again
    assert await memory.speaker_lines(ALICE) == []
    memory.keep = keep  # type: ignore[method-assign]
    for retry in ("1", "2"):
        headers = slack_tests.signed(body) | {"X-Slack-Retry-Num": retry, "X-Slack-Retry-Reason": "http_error"}
        assert (await bot.post(body, "application/json", headers))[0] == 200
    assert [line.text for line in await memory.speaker_lines(ALICE)] == ["the budget is 40k"]
    assert llm_server.requests == []


async def test_edits_and_deletions_apply_to_the_kept_lines(start_bot: Start, llm_server: FakeLLMServer) -> None:
    bot = await start_bot(listen_channels=frozenset({"C1"}))
    memory = bot.runtime.channel_memory
    first, second = said("meet at 10"), said("bring the slides")
    for event in (first, second):
        assert await bot.event(event) == 200
    edit_ts = next_ts()
    changed = {
        "type": "message",
        "subtype": "message_changed",
        "channel": "C1",
        "channel_type": "channel",
        "hidden": True,
        "message": {
            "type": "message",
            "user": "U1",
            "text": "meet at 11",
            "ts": first["ts"],
            "edited": {"user": "U1", "ts": edit_ts},
        },
        "previous_message": {"type": "message", "user": "U1", "text": "meet at 10", "ts": first["ts"]},
        "event_ts": edit_ts,
        "ts": edit_ts,
    }
    assert await bot.event(changed) == 200
    deleted = {
        "type": "message",
        "subtype": "message_deleted",
        "channel": "C1",
        "channel_type": "channel",
        "hidden": True,
        "deleted_ts": second["ts"],
        "previous_message": {"type": "message", "user": "U1", "text": "bring the slides", "ts": second["ts"]},
        "event_ts": next_ts(),
        "ts": next_ts(),
    }
    assert await bot.event(deleted) == 200
    [line] = await memory.speaker_lines(ALICE)
    assert (line.text, line.message_id, line.edited_at) == ("meet at 11", first["ts"], time_of(edit_ts))
    page = await memory.search("slack:T1:C1", "slides", 5)
    assert [hit.text for hit in page.items] == ["meet at 11"]  # the deleted line is gone from search too
    assert llm_server.requests == []


async def test_an_opted_out_speaker_is_not_kept(start_bot: Start, llm_server: FakeLLMServer) -> None:
    bot = await start_bot(listen_channels=frozenset({"C1"}))
    memory = bot.runtime.channel_memory
    await memory.set_consent(BOB, False)
    assert await bot.event(said("my phone is 555-0199", user="U2")) == 200
    assert await bot.event(said("noted")) == 200
    assert await memory.speaker_lines(BOB) == []
    assert [line.text for line in await memory.speaker_lines(ALICE)] == ["noted"]


async def test_channel_shows_and_sets_the_mode_for_managers_and_a_restart_keeps_it(
    start_bot: Start, make_runtime: Any, llm_server: FakeLLMServer, tmp_path: Any
) -> None:
    runtime = await make_runtime()
    bot = await start_bot(runtime, channel_managers=frozenset({"U3"}))
    bot.slack.add_user("U1", "Alice")["is_admin"] = True  # a workspace admin
    memory = bot.runtime.channel_memory

    assert await bot.event(said("before anyone set a mode")) == 200
    assert await memory.speaker_lines(ALICE) == []  # mention: nothing kept

    shown = await command(bot, "", user="U2")
    assert "**mention**" not in shown and "*mention* mode" in shown  # Slack's mrkdwn
    assert await command(bot, "listen", user="U2") == CHANNEL_NOT_MANAGER
    assert await bot.runtime.channel_mode(GENERAL, "mention") == "mention"
    assert await command(bot, "", user="U2", channel="DU2") == CHANNEL_IN_DM

    assert "*listen* mode" in await command(bot, "listen", user="U1")  # an admin
    await eventually(lambda: notices(bot.slack) == ["C1"])
    assert await bot.event(said("the launch is on May 3")) == 200
    assert [line.text for line in await memory.speaker_lines(ALICE)] == ["the launch is on May 3"]
    assert "*listen* mode" in await command(bot, "", user="U2")
    assert "*listen* mode" in await command(bot, "listen", user="U3")  # named in SLACK_CHANNEL_MANAGERS

    # A restart: a new runtime on the same SQLite file keeps the lines, the mode and the notice said.
    await bot.adapter.close(grace=5)
    again = await start_bot(await make_runtime(data_dir=tmp_path / "data"), channel_managers=frozenset({"U3"}))
    assert await again.runtime.channel_mode(GENERAL, "mention") == "listen"
    assert await again.event(said("and the venue is the mill", user="U2")) == 200
    assert [line.text for line in await again.runtime.channel_memory.speaker_lines(ALICE)] == ["the launch is on May 3"]
    assert [line.text for line in await again.runtime.channel_memory.speaker_lines(BOB)] == [
        "and the venue is the mill"
    ]
    assert notices(again.slack) == ["C1"]
    assert llm_server.requests == []

    # Back to mention re-arms the notice: listening again says so again.
    assert "*mention* mode" in await command(again, "mention", user="U3")
    assert await again.event(said("not kept")) == 200
    assert "*open* mode" in await command(again, "open", user="U3")
    await eventually(lambda: notices(again.slack) == ["C1", "C1"])
    assert [line.text for line in await again.runtime.channel_memory.speaker_lines(ALICE)] == ["the launch is on May 3"]


def test_the_listening_settings_and_the_modes_they_give() -> None:
    env = {
        "SLACK_BOT_TOKEN": "xoxb-1",
        "SLACK_SIGNING_SECRET": "s",
        "SLACK_ALWAYS_ON_CHANNELS": "C5",
        "SLACK_LISTEN_CHANNELS": " C6, G6 ,",
        "SLACK_CHANNEL_MANAGERS": "U7,W8",
    }
    parsed = SlackConfig.from_env(env)
    assert parsed is not None
    assert parsed.listen_channels == {"C6", "G6"} and parsed.channel_managers == {"U7", "W8"}
    assert [default_mode(parsed.always_on_channels, parsed.listen_channels, c) for c in ("C5", "C6", "C7")] == [
        "open",
        "listen",
        "mention",
    ]
    assert default_mode({1}, {2}, 9, parent=2) == "listen"  # a thread inherits its channel's
    with pytest.raises(ConfigError, match=r"SLACK_LISTEN_CHANNELS.*'#general'"):
        SlackConfig.from_env({**env, "SLACK_LISTEN_CHANNELS": "#general"})
    with pytest.raises(ConfigError, match=r"SLACK_CHANNEL_MANAGERS.*'alice'"):
        SlackConfig.from_env({**env, "SLACK_CHANNEL_MANAGERS": "alice"})
