"""Issue 12's own reproduction, end to end through the platforms: what a
person tells the bot in a DM must not reach the model when it answers them in
a channel.

One person, as a new user would: a DM "remember: my diagnosis is
hypothyroidism" (the model saves it to archival memory and to the private
block), a DM "my secret codeword is pumpernickel", a private channel mention
with that channel's own secret, then mentions asking "what is my codeword?
search your memory" (the model runs every search it has) in the private
channel, in a public channel where other people spoke first, and in the DM.

Slack: signed Events API payloads over real HTTP into the real Bolt app, the
local Web API stand-in (tests/fake_slack.py) answering and recording. Discord:
discord.py's real dispatch with dpytest as the gateway and REST API. Behind
both a real Runtime on a SQLite file, the real openai client and the scripted
local LLM server; every raw request body the server received is scanned, and
each is attributed to the event it was made for (events are sent one at a
time, the next only after the previous one's reply was delivered).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import discord
import discord.ext.test as dpytest
import pytest
from discord.ext.test import backend, factories

from adapters.discord import DiscordAdapter, DiscordConfig
from bot.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.dpytest_guild import guild_channel, guild_member
from tests.fake_llm import FakeLLMServer, Reply, is_summary_request, reply_text, reply_tool_calls, say, tool_call
from tests.fake_slack import FakeSlack
from tests.places_script import search_everything
from tests.test_slack_adapter import SlackBot, Start, dm, fake_slack, start_bot
from tests.test_sqlite_store import tables_containing

__all__ = ["fake_slack", "start_bot"]  # fixtures, imported to be found here

DIAGNOSIS, CODEWORD = "hypothyroidism", "pumpernickel"  # said in the DM only
TEAM_SECRET = "quillwort"  # said in the private channel
THEIRS = "heliotrope"  # in another person's line in the public channel, before the mention
MINE = "I'll bring the cake"  # the person's own line there, not addressed to the bot
ASK = "what is my codeword? search your memory"

REMEMBER = re.compile(r"remember: ([^\n]*)")
QUESTION = re.compile(r"what is my (\w+)\?")
EVENT_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d UTC\] [^\n]*", re.MULTILINE)


# --------------------------------------------------------------------------- the model


def _event(messages: list[dict[str, Any]]) -> tuple[int, str]:
    """Where the event being answered is (the newest message holding a "[<time> UTC] <who>:
    <text>" line, not the memory status or the channel's lines, which may quote the
    person's earlier words) and that line; (-1, "") if it left the context."""
    for at in range(len(messages) - 1, -1, -1):
        if messages[at].get("role") == "user":
            lines = EVENT_LINE.findall(messages[at].get("content") or "")
            if lines:
                return at, lines[-1]
    return -1, ""


def _results(after: list[dict[str, Any]]) -> list[str]:
    """The text each function returned to the newest assistant message with calls."""
    last = max(n for n, message in enumerate(after) if message.get("tool_calls"))
    return [
        str(json.loads(message.get("content") or "{}").get("result", ""))
        for message in after[last + 1 :]
        if message.get("role") == "tool"
    ]


def story_model(request: dict[str, Any]) -> Reply:
    """The person's words, taken as a helpful model would: "remember: X" saves X
    to archival memory, to the private block and to human (the MemGPT move that
    leaked a DM fact into every channel before lines had places); "what is my W?" runs every
    search for W, then answers with each line of the results that names W (so
    whatever the store let through is in the reply); anything else is heard."""
    messages = request.get("messages") or []
    if is_summary_request(request):  # a summary that keeps everything it was given, word for word
        return reply_text("Summary of what was said: " + json.dumps(messages[1:], ensure_ascii=False))
    at, text = _event(messages)
    after = messages[at + 1 :] if at >= 0 else []
    called = [call["function"]["name"] for message in after for call in message.get("tool_calls") or []]
    asked, remembered = QUESTION.search(text), REMEMBER.search(text)
    if "send_message" in called:
        return say("Anything else?")
    if called:  # the functions ran: answer from what they returned
        if not asked:
            return say("Noted.")
        lines = [line for result in _results(after) for line in result.splitlines() if asked[1] in line]
        return say("I found: " + " | ".join(lines)[:1500])
    if asked:
        return reply_tool_calls(*search_everything(asked[1]))
    if remembered:
        fact = remembered[1].strip()
        return reply_tool_calls(
            tool_call("archival_memory_insert", {"content": fact, "request_heartbeat": True}),
            tool_call("core_memory_append", {"name": "private", "content": fact, "request_heartbeat": True}),
            tool_call("core_memory_append", {"name": "human", "content": fact, "request_heartbeat": True}),
        )
    return say("Heard you.")


# --------------------------------------------------------------------------- the story and its checks


@dataclass
class Turn:
    """One event: the raw LLM request bodies made for it and the replies
    delivered for it, as (channel id, text)."""

    bodies: list[str]
    replies: list[tuple[str, str]]

    def holding(self, *words: str) -> list[tuple[int, str]]:
        """(request number, word) for each of `words` found in a request body."""
        return [(n, word) for n, body in enumerate(self.bodies) for word in words if word in body]

    def requests(self) -> list[dict[str, Any]]:
        return [json.loads(body) for body in self.bodies]

    def called(self) -> set[str]:
        """The functions the model called while answering the event."""
        return {
            call["function"]["name"]
            for request in self.requests()
            for message in request["messages"]
            if message.get("role") == "assistant"
            for call in message.get("tool_calls") or []
        }


@dataclass
class Story:
    diagnosis: Turn  # DM: remember: my diagnosis is ...
    codeword: Turn  # DM: my secret codeword is ...
    team_secret: Turn  # private channel: remember: the launch password is ...
    team_asks: Turn  # private channel: what is my codeword? ...
    public_asks: Turn  # public channel, after other people's lines: what is my codeword? ...
    dm_asks: Turn  # DM: what is my codeword?


def check(story: Story, database: Path, public_channel: str) -> None:
    # The story happened: the DM facts were kept (recall, archival, the private block)
    # and the channel events ran the searches that could have found them.
    assert "passages" in tables_containing(database, DIAGNOSIS)
    assert "messages" in tables_containing(database, CODEWORD)
    for turn in (story.team_asks, story.public_asks, story.dm_asks):
        assert {"conversation_search", "conversation_search_date", "archival_memory_search"} <= turn.called()
    # The platform told the channels apart: the model was told where it spoke.
    assert "the private channel #launch-team" in story.team_asks.bodies[0]
    assert "the public channel #general" in story.public_asks.bodies[0]

    # Public channel: nothing said in the DM or the private channel, in any request.
    leaked = story.public_asks.holding(DIAGNOSIS, CODEWORD, TEAM_SECRET)
    assert leaked == [], f"(request, word) of the public channel's requests: {leaked}"
    # Private channel: nothing DM-only; its own secret is found there.
    for turn in (story.team_secret, story.team_asks):
        leaked = turn.holding(DIAGNOSIS, CODEWORD)
        assert leaked == [], f"(request, word) of the private channel's requests: {leaked}"
    assert story.team_asks.holding(TEAM_SECRET)

    # The DM still finds everything: the codeword (the reply names it), the private
    # block, the private channel's secret.
    assert {word for _, word in story.dm_asks.holding(CODEWORD, DIAGNOSIS, TEAM_SECRET)} == {
        CODEWORD,
        DIAGNOSIS,
        TEAM_SECRET,
    }
    assert any(CODEWORD in text for _, text in story.dm_asks.replies)
    # The private block was filled in the DM and refused in the private channel.
    private = re.findall(r"<private[^>]*>[^<]*", system_prompt(story.dm_asks))
    assert private and DIAGNOSIS in private[0] and TEAM_SECRET not in private[0]

    # The answer to the public mention is in the public channel and tells nothing.
    assert story.public_asks.replies and all(channel == public_channel for channel, _ in story.public_asks.replies)
    for _, text in story.public_asks.replies:
        assert "I found:" in text and not any(word in text for word in (DIAGNOSIS, CODEWORD, TEAM_SECRET))

    # The DM facts the model put in human are in the DM's working context, and only there.
    # (An edit made in the DM is in its queue at once and in its system message from its next flush on.)
    human = re.findall(r"<human[^>]*>[^<]*", system_prompt(story.dm_asks))
    assert human and TEAM_SECRET in human[0]
    assert DIAGNOSIS in human[0] + edits_in_queue(story.dm_asks, "human")
    team_human = re.findall(r"<human[^>]*>[^<]*", system_prompt(story.team_asks))[0]
    assert TEAM_SECRET in team_human + edits_in_queue(story.team_asks, "human")

    # Other people's lines are read with the mention and kept nowhere; the person's own
    # line there is marked as theirs, the others' are not.
    assert THEIRS in story.public_asks.bodies[0]
    context = json.loads(story.public_asks.bodies[0])["messages"][-1]["content"]
    assert re.search(rf"\(this person\): {re.escape(MINE)}", context), context
    assert re.search(rf"\] [^\n(]+: my locker code is {THEIRS}", context), context
    assert story.dm_asks.holding(THEIRS) == []
    assert tables_containing(database, THEIRS) == set()


def system_prompt(turn: Turn) -> str:
    return str(json.loads(turn.bodies[0])["messages"][0]["content"])


def edits_in_queue(turn: Turn, block: str) -> str:
    """The text of the working-context edits of `block` that worked, in the queue of the turn's first request."""
    messages = json.loads(turn.bodies[0])["messages"]
    worked = {m["tool_call_id"] for m in messages if m["role"] == "tool" and '"status": "OK"' in m["content"]}
    calls = [call for m in messages for call in m.get("tool_calls") or [] if call["id"] in worked]
    edits = [
        json.loads(call["function"]["arguments"]) for call in calls if call["function"]["name"].startswith("core_")
    ]
    return "\n".join(str(edit.get("content") or edit.get("new_content")) for edit in edits if edit["name"] == block)


def database_of(runtime: Runtime) -> Path:
    return Path(runtime.settings.data_dir) / "memgpt.sqlite3"


# --------------------------------------------------------------------------- Slack


PUBLIC_ID, TEAM_ID = "C1", "G1"


async def slack_turn(bot: SlackBot, llm: FakeLLMServer, event: dict[str, Any]) -> Turn:
    asked, posted = len(llm.raw_requests), len(bot.slack.calls_to("chat.postMessage"))
    assert await bot.event(event) == 200
    # Returns once posted; the bound is roomy because the first search of a test session
    # loads the embedding model (seconds on a busy machine).
    await bot.slack.wait_for("chat.postMessage", posted + 1, within=60)
    await bot.adapter.drain()
    posts = bot.slack.calls_to("chat.postMessage")[posted:]
    return Turn(
        [request.raw_body.decode() for request in llm.raw_requests[asked:]],
        [(str(post.args["channel"]), str(post.args["text"])) for post in posts],
    )


def slack_mention(slack: FakeSlack, channel: str, text: str) -> dict[str, Any]:
    """An app_mention by Alice, posted in the channel (its history lists it too)."""
    message = slack.add_message(channel, "U1", f"<@UBOT> {text}")
    return {**message, "type": "app_mention", "channel": channel, "team": "T1"}


async def test_slack_a_dm_stays_in_the_dm(start_bot: Start, fake_slack: FakeSlack, llm_server: FakeLLMServer) -> None:
    fake_slack.add_channel(TEAM_ID, "launch-team", private=True)
    llm_server.set_handler(story_model)
    bot = await start_bot()

    diagnosis = await slack_turn(bot, llm_server, dm(f"remember: my diagnosis is {DIAGNOSIS}"))
    codeword = await slack_turn(bot, llm_server, dm(f"my secret codeword is {CODEWORD}"))
    team_secret = await slack_turn(
        bot, llm_server, slack_mention(fake_slack, TEAM_ID, f"remember: the launch password is {TEAM_SECRET}")
    )
    team_asks = await slack_turn(bot, llm_server, slack_mention(fake_slack, TEAM_ID, ASK))
    fake_slack.add_message(PUBLIC_ID, "U2", f"my locker code is {THEIRS}, don't tell")
    fake_slack.add_message(PUBLIC_ID, "U3", "lunch at noon?")
    fake_slack.add_message(PUBLIC_ID, "U1", MINE)
    public_asks = await slack_turn(bot, llm_server, slack_mention(fake_slack, PUBLIC_ID, ASK))
    dm_asks = await slack_turn(bot, llm_server, dm("what is my codeword?"))

    story = Story(diagnosis, codeword, team_secret, team_asks, public_asks, dm_asks)
    check(story, database_of(bot.runtime), PUBLIC_ID)
    assert all(channel == "DU1" for channel, _ in dm_asks.replies)
    assert [channel for channel, _ in team_asks.replies] == [TEAM_ID]


# --------------------------------------------------------------------------- Discord


@dataclass
class Guild:
    adapter: DiscordAdapter
    runtime: Runtime

    def channel(self, name: str) -> discord.TextChannel:
        return guild_channel(name)

    def member(self, name: str) -> discord.Member:
        return guild_member(name)

    def mention(self, text: str) -> str:
        assert self.adapter.client.user is not None
        return f"<@{self.adapter.client.user.id}> {text}"


@pytest.fixture
async def guild(make_runtime: RuntimeFactory) -> AsyncIterator[Guild]:
    """A guild with a public channel and a private one (@everyone may not view it)."""
    runtime = await make_runtime()
    adapter = DiscordAdapter(runtime, DiscordConfig(token="test-token"))
    client = adapter.client
    await client._async_setup_hook()  # dpytest never logs in; discord.py binds the loop there
    dpytest.configure(client, guilds=["Launch"], text_channels=["general", "launch-team"], members=["alice", "bob"])
    client._connection.loop = asyncio.get_running_loop()
    guild = Guild(adapter, runtime)
    make_private(guild.channel("launch-team"), dpytest.get_config().guilds[0].me, guild.member("alice"))
    yield guild
    await dpytest.empty_queue()


def make_private(channel: discord.TextChannel, *members: discord.Member) -> None:
    """@everyone may not view the channel, its members may (a CHANNEL_UPDATE as Discord
    sends it: dpytest's own update_text_channel types member overwrites as discord.py
    does not read them)."""
    member_may = discord.Permissions(view_channel=True, send_messages=True, read_message_history=True)
    data = factories.dict_from_channel(channel)
    data["permission_overwrites"] = [
        {
            "id": str(channel.guild.id),
            "type": 0,
            "allow": "0",
            "deny": str(discord.Permissions(view_channel=True).value),
        },
        *({"id": str(member.id), "type": 1, "allow": str(member_may.value), "deny": "0"} for member in members),
    ]
    backend.get_state().parse_channel_update(data)


async def discord_turn(llm: FakeLLMServer, text: str, channel: Any, member: discord.Member) -> Turn:
    asked = len(llm.raw_requests)
    await dpytest.message(text, channel=channel, member=member)  # returns once the event was answered
    replies = []
    while not dpytest.sent_queue.empty():
        message = dpytest.sent_queue.get_nowait()
        replies.append((str(message.channel.id), message.content))
    assert replies, "every event is answered"
    return Turn([request.raw_body.decode() for request in llm.raw_requests[asked:]], replies)


async def test_discord_a_dm_stays_in_the_dm(guild: Guild, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(story_model)
    alice, bob = guild.member("alice"), guild.member("bob")
    general, team = guild.channel("general"), guild.channel("launch-team")
    direct = await alice.create_dm()

    diagnosis = await discord_turn(llm_server, f"remember: my diagnosis is {DIAGNOSIS}", direct, alice)
    codeword = await discord_turn(llm_server, f"my secret codeword is {CODEWORD}", direct, alice)
    team_secret = await discord_turn(
        llm_server, guild.mention(f"remember: the launch password is {TEAM_SECRET}"), team, alice
    )
    team_asks = await discord_turn(llm_server, guild.mention(ASK), team, alice)
    backend.make_message(f"my locker code is {THEIRS}, don't tell", bob, general)
    backend.make_message(MINE, alice, general)
    await dpytest.run_all_events()
    public_asks = await discord_turn(llm_server, guild.mention(ASK), general, alice)
    dm_asks = await discord_turn(llm_server, "what is my codeword?", direct, alice)

    story = Story(diagnosis, codeword, team_secret, team_asks, public_asks, dm_asks)
    check(story, database_of(guild.runtime), str(general.id))
    assert all(channel == str(direct.id) for channel, _ in dm_asks.replies)
    assert [channel for channel, _ in team_asks.replies] == [str(team.id)]
