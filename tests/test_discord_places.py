"""Where each Discord event happened (its Place) and the channel context read
with it, through discord.py's real dispatch with dpytest standing in for the
gateway and REST API: a public channel, a private one (@everyone may not view
it), threads (public and private) and a DM. Behind the adapter a recording bot
keeps the events it was handed: what the bot layer does with them is tested
with the bot layer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import discord
import discord.ext.test as dpytest
import pytest
from discord.ext.test import backend

from adapters.discord import DiscordAdapter, DiscordConfig
from bot.events import Place, Redo, UserMessage
from tests.channel_labels import who_said
from tests.dpytest_guild import guild_channel, guild_member, the_guild
from tests.recording_bot import RecordingBot

snowflakes = iter(range(1_400_000_000_000_000_000, 1_500_000_000_000_000_000))


@dataclass
class Server:
    adapter: DiscordAdapter
    bot: RecordingBot

    @property
    def me(self) -> discord.ClientUser:
        assert self.adapter.client.user is not None
        return self.adapter.client.user

    @property
    def guild(self) -> discord.Guild:
        return the_guild()

    def channel(self, name: str) -> discord.TextChannel:
        return guild_channel(name)

    def member(self, name: str) -> discord.Member:
        return guild_member(name)

    def thread(self, parent: discord.TextChannel, name: str, *, private: bool = False) -> discord.Thread:
        """A thread as the gateway announces one (THREAD_CREATE)."""
        thread_id = next(snowflakes)
        self.adapter.client._connection.parse_thread_create(
            {
                "id": str(thread_id),
                "type": 12 if private else 11,
                "guild_id": str(self.guild.id),
                "parent_id": str(parent.id),
                "owner_id": str(self.member("alice").id),
                "name": name,
                "message_count": 0,
                "member_count": 1,
                "rate_limit_per_user": 0,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": discord.utils.utcnow().isoformat(),
                    "locked": False,
                },
            }
        )
        thread = self.guild.get_thread(thread_id)
        assert thread is not None
        return thread

    async def mention(self, text: str, channel: Any, member: str = "alice") -> UserMessage:
        await dpytest.message(f"<@{self.me.id}> {text}", channel=channel, member=self.member(member))
        return self.bot.messages()[-1]


async def earlier(channel: Any, *lines: tuple[Any, str]) -> None:
    """Messages posted before the bot is mentioned (not for the bot: no events)."""
    for author, text in lines:
        backend.make_message(text, author, channel)
    await dpytest.run_all_events()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    bot = RecordingBot()
    adapter = DiscordAdapter(bot, DiscordConfig(token="test-token", channel_context_messages=3))
    client = adapter.client
    await client._async_setup_hook()  # dpytest never logs in; discord.py binds the loop there
    dpytest.configure(client, guilds=["Gardeners"], text_channels=["general", "secret"], members=["alice", "bob"])
    client._connection.loop = asyncio.get_running_loop()
    server = Server(adapter, bot)
    everyone = server.guild.default_role
    backend.update_text_channel(server.channel("secret"), everyone, discord.PermissionOverwrite(view_channel=False))
    yield server
    await dpytest.empty_queue()


async def test_a_public_channel_mention_carries_its_place_and_the_lines_before_it(server: Server) -> None:
    general, alice, bob = server.channel("general"), server.member("alice"), server.member("bob")
    await earlier(
        general,
        (alice, "too old to be read"),
        (bob, "my tomatoes split"),
        (server.me, "Water them evenly."),
        (alice, f"what do you think, <@{bob.id}>?"),
    )
    event = await server.mention("why do tomatoes split?", general)

    assert event.place == Place("public", str(general.id), "#general")
    assert event.text == "why do tomatoes split?"
    # The last three lines (MEMGPT_CHANNEL_CONTEXT_MESSAGES=3) before the mention, oldest first,
    # without the mention itself; the bot's own line marked, other people's mentions as names.
    assert [(line.author, line.text, line.from_bot) for line in event.channel_context] == [
        ("bob_1_nick", "my tomatoes split", False),
        (server.guild.me.display_name, "Water them evenly.", True),
        ("alice_0_nick", "what do you think, @bob_1_nick?", False),
    ]
    times = [line.created_at for line in event.channel_context]
    assert times == sorted(times) and times[-1] <= event.created_at
    # The model is told whose each line is: Alice's own is hers, not "other people's".
    assert who_said(event) == [
        "bob_1_nick: my tomatoes split",
        f"{server.guild.me.display_name} (a bot): Water them evenly.",
        "alice_0_nick (this person): what do you think, @bob_1_nick?",
    ]


async def test_a_channel_everyone_may_not_view_is_private(server: Server) -> None:
    secret = server.channel("secret")
    await earlier(secret, (server.member("bob"), "the surprise party is on friday"))
    event = await server.mention("remind me what we planned", secret)
    assert event.place == Place("private", str(secret.id), "#secret")
    assert event.place.key == f"private:{secret.id}"
    assert [line.text for line in event.channel_context] == ["the surprise party is on friday"]


async def test_a_thread_shares_its_channels_place_and_reads_only_the_thread(server: Server) -> None:
    general, bob = server.channel("general"), server.member("bob")
    await earlier(general, (bob, "said in the channel itself"))
    thread = server.thread(general, "tomatoes")
    await earlier(thread, (bob, "said in the thread"))
    event = await server.mention("and in here?", thread)
    assert event.place == Place("public", str(general.id), "#general", thread=str(thread.id))
    assert event.place.key == f"public:{general.id}"  # the channel's conversation
    assert [line.text for line in event.channel_context] == ["said in the thread"]

    # A private thread is private whatever its parent, and a conversation of its own:
    # its members are neither the channel's nor another private thread's.
    hidden = server.thread(general, "plans", private=True)
    event = await server.mention("just between us", hidden)
    assert event.place == Place("private", str(hidden.id), "#plans", thread=str(hidden.id))
    other = server.thread(general, "other plans", private=True)
    assert (await server.mention("and us", other)).place.key == f"private:{other.id}" != event.place.key


async def test_a_dm_is_the_persons_dm_and_reads_no_context(server: Server) -> None:
    alice = server.member("alice")
    dm = await alice.create_dm()
    await earlier(dm, (server.me, "an earlier reply in the DM"))
    await dpytest.message("hello", channel=dm, member=alice)
    [event] = server.bot.messages()
    assert event.place == Place() and event.place.key == "dm"
    assert event.channel_context == []


async def test_unreadable_history_is_warned_once_and_the_mention_still_answered(
    server: Server, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    general = server.channel("general")
    await earlier(general, (server.member("bob"), "hello"))

    async def forbidden(*args: Any, **kwargs: Any) -> Any:
        response = type("Response", (), {"status": 403, "reason": "Forbidden"})()
        raise discord.Forbidden(response, {"code": 50001, "message": "Missing Access"})

    monkeypatch.setattr(server.adapter.client.http, "logs_from", forbidden)
    with caplog.at_level(logging.WARNING):
        first = await server.mention("one", general)
        second = await server.mention("two", general)
    assert first.channel_context == [] and second.channel_context == []
    assert [event.text for event in server.bot.messages()] == ["one", "two"]
    assert [reply.content for reply in [dpytest.sent_queue.get_nowait() for _ in range(2)]] == [
        f"<@{server.member('alice').id}> noted"
    ] * 2
    warnings = [record for record in caplog.records if "channel context" in record.getMessage()]
    assert len(warnings) == 1
    assert str(general.id) in warnings[0].getMessage() and "Read Message History" in warnings[0].getMessage()


async def test_no_context_is_read_when_the_setting_is_zero(server: Server) -> None:
    server.adapter.config.channel_context_messages = 0
    general = server.channel("general")
    await earlier(general, (server.member("bob"), "hello"))
    event = await server.mention("hi", general)
    assert event.place.kind == "public" and event.channel_context == []


async def test_a_replay_keeps_the_place_recorded_with_the_message(server: Server) -> None:
    general = server.channel("general")
    first = await server.mention("said while the channel was public", general)
    payload = server.bot.payloads[first.event_id]
    assert payload["place"] == {"key": f"public:{general.id}", "name": "#general", "thread": ""}

    # The channel becomes private before the restart; the replay still files the message
    # where it was said (what it said was public then).
    backend.update_text_channel(general, server.guild.default_role, discord.PermissionOverwrite(view_channel=False))
    await server.adapter.replay([Redo(first.event_id, payload)])
    replayed = server.bot.messages()[-1]
    assert replayed.event_id == first.event_id and replayed.place == first.place
    # A new message there is private now.
    assert (await server.mention("said now", general)).place.kind == "private"


def test_a_message_renders_its_places_name_and_nothing_for_a_dm() -> None:
    base: dict[str, Any] = {"platform": "discord", "user_id": "1", "text": "hi", "display_name": "alice"}
    assert UserMessage(**base, place=Place("public", "7", "#general")).render().endswith("alice in #general: hi")
    assert UserMessage(**base, place=Place()).render().endswith("] alice: hi")
    # An adapter's own wording wins (Discord adds the server's name).
    worded = UserMessage(**base, channel="#general in Gardeners", place=Place("public", "7", "#general"))
    assert worded.render().endswith("alice in #general in Gardeners: hi")
