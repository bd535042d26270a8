"""The Discord adapter through discord.py's real event dispatch and real model objects.

dpytest stands in for the Discord gateway and REST API: it builds real payloads,
feeds them to the client's connection state (`parse_message_create`,
`parse_guild_member_add`, ...) and records what the bot sends. Slash commands and
buttons go through the same path: an INTERACTION_CREATE payload handed to
`parse_interaction_create`, which runs the real CommandTree and View dispatch;
only the HTTP layer under interaction responses (discord.py's webhook adapter,
which dpytest does not cover) is replaced by a recorder. Behind the adapter runs
a real Runtime on SQLite, talking to the scripted local LLM server.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import discord
import discord.ext.test as dpytest
import pytest
from discord.ext.test import backend
from discord.http import Route
from discord.webhook.async_ import AsyncWebhookAdapter, async_context

from adapters.discord import DiscordAdapter, DiscordConfig, dm_address
from adapters.splitting import TRUNCATED, split_at_most
from bot.channels.listening import LISTENING_NOTICE
from bot.commands.catalog import (
    FORGET_CANCELLED,
    FORGET_DONE,
    FORGET_QUESTION,
    FORGET_TIMED_OUT,
    FORGET_WORKING,
    NOTHING_HELD,
)
from bot.errors import ConfigError
from bot.events import Reply as BotReply
from bot.events import ScheduledTick
from bot.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.dpytest_guild import guild_channel, guild_member, the_guild
from tests.fake_llm import FakeLLMServer, Reply, reply_tool_calls, say, tool_call
from tests.helpers import user_texts

FENCE_LINE = re.compile(r"^[ \t]*```[^\n]*$", re.MULTILINE)
snowflakes = itertools.count(1_300_000_000_000_000_000)


def last_user_text(request: dict[str, Any]) -> str:
    return user_texts(request)[-1]


class InteractionHTTP(AsyncWebhookAdapter):
    """Records interaction responses at the HTTP boundary and answers like Discord would;
    everything above it (InteractionResponse, followups, views) is discord.py's own code."""

    def __init__(self, app_user: dict[str, Any]) -> None:
        super().__init__()
        self.app_user = app_user
        self.calls: list[Call] = []

    async def request(self, route: Route, session: Any, *, payload: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        call = Call(route.method, route.path, payload or {}, next(snowflakes))
        self.calls.append(call)
        if route.path.endswith("/callback"):
            return {
                "interaction": {
                    "id": str(route.webhook_id),
                    "type": call.body["type"],
                    "response_message_id": str(call.message_id),
                    "response_message_ephemeral": call.ephemeral,
                }
            }
        return message_payload(
            call.message_id, self.app_user, call.data.get("content") or "", call.data.get("flags", 0)
        )

    def texts(self) -> list[str]:
        """What the person saw, in order: the content of each response, followup or edit."""
        return [call.data["content"] for call in self.calls if call.data.get("content")]

    def buttons(self) -> tuple[int, dict[str, str]]:
        """The message id of the last response with buttons, and their label -> custom_id."""
        for call in reversed(self.calls):
            rows = call.data.get("components") or []
            if rows:
                return call.message_id, {
                    button["label"]: button["custom_id"] for row in rows for button in row["components"]
                }
        raise AssertionError("no response had buttons")


@dataclass
class Call:
    method: str
    path: str
    body: dict[str, Any]
    message_id: int

    @property
    def data(self) -> dict[str, Any]:
        # Interaction callbacks wrap the message in "data"; followups and edits send it bare.
        return self.body.get("data") or {} if self.path.endswith("/callback") else self.body

    @property
    def ephemeral(self) -> bool:
        return bool((self.data.get("flags") or 0) & 64)


def message_payload(
    message_id: int, author: dict[str, Any], content: str, flags: int = 0, channel_id: int = 0
) -> dict[str, Any]:
    return {
        "id": str(message_id),
        "channel_id": str(channel_id),
        "author": author,
        "content": content,
        "timestamp": discord.utils.utcnow().isoformat(),
        "edited_timestamp": None,
        "tts": False,
        "mention_everyone": False,
        "mentions": [],
        "mention_roles": [],
        "attachments": [],
        "embeds": [],
        "pinned": False,
        "type": 0,
        "flags": flags,
    }


@dataclass
class Harness:
    runtime: Runtime
    adapter: DiscordAdapter
    llm: FakeLLMServer
    http: InteractionHTTP
    errors: list[BaseException] = field(default_factory=list)

    @property
    def client(self) -> discord.Client:
        return self.adapter.client

    @property
    def me(self) -> discord.ClientUser:
        assert self.client.user is not None
        return self.client.user

    @property
    def guild(self) -> discord.Guild:
        return the_guild()

    def channel(self, name: str) -> discord.TextChannel:
        return guild_channel(name)

    def member(self, name: str) -> discord.Member:
        return guild_member(name)

    async def agent_id(self, user: discord.abc.User) -> str | None:
        record = await self.runtime.store.find_agent(f"discord:{user.id}")
        return record.id if record else None

    async def interact(self, payload: dict[str, Any]) -> None:
        """Hand an INTERACTION_CREATE payload to the client as the gateway would, and wait
        for the tasks the command tree and views start for it."""
        self.client._connection.parse_interaction_create(payload)
        await settle()

    def interaction(
        self,
        user: discord.abc.User,
        channel: discord.abc.Messageable,
        *,
        kind: int,
        data: dict[str, Any],
        message_id: int | None = None,
    ) -> dict[str, Any]:
        user_data = {"id": str(user.id), "username": user.name, "discriminator": "0001", "avatar": None}
        payload: dict[str, Any] = {
            "id": str(next(snowflakes)),
            "application_id": str(self.me.id),
            "type": kind,
            "token": f"interaction-token-{next(snowflakes)}",
            "version": 1,
            "data": data,
            "attachment_size_limit": 8 * 1024 * 1024,
            "locale": "en-US",
            "app_permissions": "0",
        }
        if isinstance(channel, discord.TextChannel):
            payload |= {
                "guild_id": str(channel.guild.id),
                "context": 0,
                "channel": {"id": str(channel.id), "type": 0, "guild_id": str(channel.guild.id)},
                "member": {
                    "user": user_data,
                    "roles": [],
                    "joined_at": discord.utils.utcnow().isoformat(),
                    "deaf": False,
                    "mute": False,
                    "flags": 0,
                    "permissions": "0",
                },
            }
        else:
            payload |= {"context": 1, "user": user_data, "channel": {"id": str(getattr(channel, "id", 0)), "type": 1}}
        if message_id is not None:
            payload["message"] = message_payload(message_id, self.http.app_user, "", 64, int(payload["channel"]["id"]))
        return payload

    async def slash(self, name: str, user: discord.abc.User, channel: discord.abc.Messageable, **options: str) -> None:
        data: dict[str, Any] = {"id": str(next(snowflakes)), "name": name, "type": 1}
        if options:
            data["options"] = [{"name": key, "type": 3, "value": value} for key, value in options.items()]
        await self.interact(self.interaction(user, channel, kind=2, data=data))

    async def press(self, label: str, user: discord.abc.User, channel: discord.abc.Messageable) -> None:
        message_id, buttons = self.http.buttons()
        await self.interact(
            self.interaction(
                user, channel, kind=3, message_id=message_id, data={"custom_id": buttons[label], "component_type": 2}
            )
        )


async def settle() -> None:
    prefixes = ("CommandTree-invoker", "discord-ui-view-dispatch", "discord-ui-view-timeout")
    for _ in range(50):
        pending = [
            task
            for task in asyncio.all_tasks()
            if task is not asyncio.current_task() and not task.done() and task.get_name().startswith(prefixes)
        ]
        if not pending:
            return
        await asyncio.gather(*pending)


def sent() -> list[discord.Message]:
    """Everything the bot sent since the last call, in order."""
    messages = []
    while not dpytest.sent_queue.empty():
        messages.append(dpytest.sent_queue.get_nowait())
    return messages


def in_dm_with(message: discord.Message, user: discord.abc.User) -> bool:
    # dpytest rebuilds the DM channel of a sent message without its recipient: compare ids.
    return user.dm_channel is not None and message.channel.id == user.dm_channel.id


def patch_http(harness: Harness, name: str, before: Callable[[Any], Any]) -> None:
    """Wrap one FakeHttp call. dpytest reads `channel` from its caller's frame, so the
    wrapper keeps that local for it."""
    http = harness.client.http
    original = getattr(http, name)

    async def wrapper(channel_id: int, **kwargs: Any) -> Any:
        channel = sys._getframe(1).f_locals["channel"]
        await before(channel)
        return await original(channel_id, **kwargs)

    setattr(http, name, wrapper)


@pytest.fixture
async def discord_bot(
    request: pytest.FixtureRequest, make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> AsyncIterator[Harness]:
    # A roomy window: these tests are about Discord, not about memory pressure.
    runtime = await make_runtime(context_window=32_768)
    forget_timeout = getattr(request, "param", 60.0)
    adapter = DiscordAdapter(runtime, DiscordConfig(token="test-token"), forget_timeout=forget_timeout)
    client = adapter.client
    # dpytest never logs in, and discord.py 2.7 binds the client to its loop at login.
    await client._async_setup_hook()
    dpytest.configure(
        client,
        guilds=["Gardeners"],
        text_channels=["general", "garden-chat"],
        voice_channels=0,
        members=["alice", "bob"],
    )
    # dpytest swaps in its own connection state: give it the running loop (discord.py 2.7 no
    # longer takes it from the constructor) and the command tree that was attached to the old one.
    client._connection.loop = asyncio.get_running_loop()
    client._connection._command_tree = adapter.tree
    adapter.config.always_on_channels = frozenset(
        {discord.utils.get(dpytest.get_config().channels, name="garden-chat").id}
    )
    app_user = {
        "id": str(client.user.id),
        "username": client.user.name,
        "discriminator": "0001",
        "avatar": None,
        "bot": True,
    }
    harness = Harness(runtime, adapter, llm_server, InteractionHTTP(app_user))
    token = async_context.set(harness.http)

    async def record_error(event: str, *args: Any, **kwargs: Any) -> None:
        harness.errors.append(sys.exc_info()[1] or RuntimeError(event))

    async def record_tree_error(interaction: discord.Interaction, error: Exception) -> None:
        harness.errors.append(error)

    client.on_error = record_error  # type: ignore[method-assign]
    adapter.tree.on_error = record_tree_error  # type: ignore[method-assign]
    yield harness
    async_context.reset(token)
    await dpytest.empty_queue()
    assert not harness.errors, harness.errors
    assert len(runtime.doors.lanes) == 0


# -- messages ------------------------------------------------------------------


async def test_a_dm_reaches_the_senders_agent_and_the_reply_arrives_in_the_dm(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("Hello Alice! How is the garden?"))
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    await dpytest.message("hi there, it's me", channel=dm, member=alice)

    [reply] = sent()
    assert reply.content == "Hello Alice! How is the garden?"
    assert in_dm_with(reply, alice)
    [request] = discord_bot.llm.requests
    assert last_user_text(request).endswith("alice in DM: hi there, it's me")
    agent = await discord_bot.runtime.agent(f"discord:{alice.id}")
    assert await discord_bot.runtime.store.count_messages(agent.id) >= 2
    assert await discord_bot.agent_id(discord_bot.member("bob")) is None


async def test_a_mention_in_a_server_channel_is_answered_there_mentioning_the_user(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("Plant garlic in October."))
    alice, general = discord_bot.member("alice"), discord_bot.channel("general")
    await dpytest.message(
        f"<@{discord_bot.me.id}> when should I plant garlic, <@{discord_bot.member('bob').id}>?",
        channel=general,
        member=alice,
    )

    [reply] = sent()
    assert reply.channel.id == general.id
    assert reply.content == f"<@{alice.id}> Plant garlic in October."
    assert [user.id for user in reply.mentions] == [alice.id]
    text = last_user_text(discord_bot.llm.requests[0])
    assert text.endswith("in #general in Gardeners: when should I plant garlic, @bob_1_nick?")
    assert await discord_bot.agent_id(alice) is not None

    await dpytest.message(f"<@{discord_bot.me.id}>", channel=general, member=alice)  # a bare ping
    assert last_user_text(discord_bot.llm.requests[-1]).endswith("in #general in Gardeners: @FakeApp_nick")
    assert len(sent()) == 1


async def test_only_addressed_messages_are_answered(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("Always listening here."))
    alice = discord_bot.member("alice")
    await dpytest.message("just chatting with friends", channel=discord_bot.channel("general"), member=alice)
    assert sent() == [] and discord_bot.llm.requests == []

    # The bot's own messages, even ones that mention it, in a DM or an always-on channel.
    backend.make_message(f"<@{discord_bot.me.id}> echo", discord_bot.me, discord_bot.channel("garden-chat"))
    backend.make_message("echo", discord_bot.me, await alice.create_dm())
    await dpytest.run_all_events()
    assert discord_bot.llm.requests == [] and sent() == []

    chat = discord_bot.channel("garden-chat")
    await dpytest.message("anyone growing tomatoes?", channel=chat, member=alice)
    await discord_bot.adapter.pipeline.drain()
    # An always-on channel is open: it keeps what is said, and says so once (bot/channels/).
    notice, reply = sorted(sent(), key=lambda message: message.content != LISTENING_NOTICE)
    assert notice.channel.id == chat.id and notice.content == LISTENING_NOTICE
    assert reply.channel.id == chat.id and reply.content == f"<@{alice.id}> Always listening here."
    assert len(discord_bot.llm.requests) == 1


async def test_a_long_reply_arrives_in_order_under_the_limit_with_code_fences_intact(discord_bot: Harness) -> None:
    code = "\n".join(f"    water(bed={i}, litres={i % 7 + 1})  # keep the soil moist" for i in range(50))
    prose = " ".join(f"Sentence {i} about compost and mulch." for i in range(60))
    long = f"{prose}\n\nHere is the schedule:\n```python\ndef schedule():\n{code}\n```\n\n{prose}\nThe end."
    assert len(long) > 5_000
    discord_bot.llm.set_handler(lambda request: say(long))
    alice, general = discord_bot.member("alice"), discord_bot.channel("general")
    await dpytest.message(f"<@{discord_bot.me.id}> give me a watering plan", channel=general, member=alice)

    chunks = [message.content for message in sent()]
    assert len(chunks) >= 3
    assert all(len(chunk) <= 2_000 for chunk in chunks)
    assert chunks[0].startswith(f"<@{alice.id}> ") and not any(c.startswith("<@") for c in chunks[1:])
    assert all(len(FENCE_LINE.findall(chunk)) % 2 == 0 for chunk in chunks)
    joined = "\n".join(chunks)[len(f"<@{alice.id}> ") :]

    def content(text: str) -> str:
        return re.sub(r"\s+", "", FENCE_LINE.sub("", text))

    assert content(joined) == content(long)
    assert chunks[-1].endswith("The end.")


async def test_ten_dms_sent_at_once_are_answered_in_order(discord_bot: Harness) -> None:
    def answer(request: dict[str, Any]) -> Reply:
        number = re.findall(r"number (\d+)", last_user_text(request))[-1]
        return say(f"reply to {number}. " + "Long answer. " * 160)  # ~2,100 chars: two messages each

    discord_bot.llm.set_handler(answer)
    typing_calls = 0

    async def slower_for_earlier_events(channel: Any) -> None:
        # Typing for event N takes longer than for N+1, and every send yields: an adapter that
        # let the typing indicator or sending of N+1 overtake N would reorder the answers.
        nonlocal typing_calls
        typing_calls += 1
        await asyncio.sleep(max(0, 10 - typing_calls) * 0.005)

    async def yield_a_little(channel: Any) -> None:
        await asyncio.sleep(0.002)

    patch_http(discord_bot, "send_typing", slower_for_earlier_events)
    patch_http(discord_bot, "send_message", yield_a_little)
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    for i in range(10):  # all ten are dispatched before any handler runs
        backend.make_message(f"message number {i}", alice, dm)
    await dpytest.run_all_events()

    messages = sent()
    assert len(messages) == 20
    firsts = [m.content for m in messages[::2]]
    assert [re.findall(r"^reply to (\d+)\.", text) for text in firsts] == [[str(i)] for i in range(10)]
    assert all(m.content.startswith("Long answer.") for m in messages[1::2])
    seen = [re.findall(r"number (\d+)", last_user_text(request))[-1] for request in discord_bot.llm.requests]
    assert seen == [str(i) for i in range(10)]


async def test_a_send_failure_is_logged_and_the_bot_keeps_working(
    discord_bot: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    discord_bot.llm.set_handler(lambda request: say("You will not see this."))
    general = discord_bot.channel("general")
    # Nobody may send in #general. (A member overwrite for the bot alone would be ignored:
    # dpytest 0.7 writes overwrite types as strings, discord.py 2 compares them with ints.)
    await dpytest.set_permission_overrides(discord_bot.guild.default_role, general, send_messages=False)
    alice = discord_bot.member("alice")
    with caplog.at_level(logging.WARNING, logger="adapters.discord"):
        await dpytest.message(f"<@{discord_bot.me.id}> hello?", channel=general, member=alice)
    assert sent() == []
    [record] = [r for r in caplog.records if r.name == "adapters.discord.send"]
    assert record.levelno == logging.WARNING and str(alice.id) in record.getMessage()
    assert "test-token" not in caplog.text

    discord_bot.llm.set_handler(lambda request: say("Here I am."))
    await dpytest.message("hello again", channel=await alice.create_dm(), member=alice)
    assert [m.content for m in sent()] == ["Here I am."]


# -- joins ---------------------------------------------------------------------


async def test_a_member_join_wakes_their_agent_and_the_greeting_goes_to_their_dms(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("Welcome to Gardeners, Maya!"))
    maya = await dpytest.member_join(discord_bot.guild, name="Maya")
    await dpytest.run_all_events()

    [request] = discord_bot.llm.requests
    assert "[event] Maya joined the Gardeners server." in last_user_text(request)
    [greeting] = sent()
    assert greeting.content == "Welcome to Gardeners, Maya!" and in_dm_with(greeting, maya)
    assert await discord_bot.agent_id(maya) is not None


async def test_a_greeting_falls_back_to_the_system_channel_when_dms_are_closed(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("Welcome, Sam!"))
    general = discord_bot.channel("general")
    discord_bot.guild._system_channel_id = general.id  # dpytest has no setter for the system channel

    async def closed_dms(channel: Any) -> None:
        if isinstance(channel, discord.DMChannel):
            raise discord.Forbidden(
                backend.FakeRequest(403, "Forbidden"), {"code": 50007, "message": "Cannot send messages to this user"}
            )

    patch_http(discord_bot, "send_message", closed_dms)
    sam = await dpytest.member_join(discord_bot.guild, name="Sam")
    await dpytest.run_all_events()
    [greeting] = sent()
    assert greeting.channel.id == general.id and greeting.content == f"<@{sam.id}> Welcome, Sam!"


async def test_events_from_elsewhere_are_answered_where_reply_to_says(discord_bot: Harness) -> None:
    # The path a scheduled check-in takes (bot/checkins/scheduler.py): the runtime, then the
    # adapter's delivery; no Discord message to answer, only an address.
    discord_bot.llm.set_handler(lambda request: say("Good morning! Did the seedlings sprout?"))
    alice, chat = discord_bot.member("alice"), discord_bot.channel("garden-chat")
    tick = ScheduledTick(
        platform="discord", user_id=str(alice.id), reason="Daily check-in", reply_to=dm_address(alice.id)
    )
    await discord_bot.adapter.deliver(await discord_bot.runtime.handle(tick))
    [dm] = sent()
    assert in_dm_with(dm, alice) and dm.content == "Good morning! Did the seedlings sprout?"
    assert "[scheduled tick] Daily check-in" in last_user_text(discord_bot.llm.requests[0])

    await discord_bot.adapter.deliver(
        [
            BotReply(
                text="Also: frost tonight.",
                platform="discord",
                user_id=str(alice.id),
                event_id="tick-2",
                reply_to={"channel_id": chat.id, "guild": True, "user_id": alice.id},
            )
        ]
    )
    [shared] = sent()
    assert shared.channel.id == chat.id and shared.content == f"<@{alice.id}> Also: frost tonight."


# -- uploads -------------------------------------------------------------------


async def test_an_attached_markdown_file_is_saved_to_archival_memory_before_the_text(
    discord_bot: Harness, tmp_path: Path
) -> None:
    discord_bot.llm.set_handler(lambda request: say("Thanks!"))
    notes = tmp_path / "garden.md"
    notes.write_text("# Watering\n\nWater tomatoes at dawn, never at noon.\n\n# Soil\n\nUse compost rich in nitrogen.")
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    backend.make_message("here are my notes", alice, dm, attachments=[backend.make_attachment(notes)])
    await dpytest.run_all_events()

    assert [m.content for m in sent()] == ["Saved garden.md to my memory (2 passages).", "Thanks!", "Thanks!"]
    first, second = (last_user_text(request) for request in discord_bot.llm.requests)
    assert "uploaded the file 'garden.md'" in first and second.endswith("alice in DM: here are my notes")
    agent = await discord_bot.runtime.agent(f"discord:{alice.id}")
    assert await discord_bot.runtime.store.count_passages(agent.id) == 2
    found = await discord_bot.runtime.archival.search(agent.id, "when do I water tomatoes?", 1)
    assert "dawn" in found.items[0][0].text and found.items[0][0].source == "garden.md"


async def test_unsupported_or_oversized_attachments_are_refused_without_waking_the_agent(
    discord_bot: Harness, tmp_path: Path
) -> None:
    program = tmp_path / "setup.exe"
    program.write_bytes(b"MZ\x90\x00" * 10)
    big = tmp_path / "big.txt"
    big.write_text("x" * 3_000)
    discord_bot.adapter.config.max_upload_bytes = 2_048
    alice, general = discord_bot.member("alice"), discord_bot.channel("general")
    backend.make_message(
        f"<@{discord_bot.me.id}>",
        alice,
        general,
        attachments=[backend.make_attachment(program), backend.make_attachment(big)],
    )
    await dpytest.run_all_events()

    assert [m.content for m in sent()] == [
        f"<@{alice.id}> I can't read setup.exe: I only take text, Markdown, HTML or PDF files.",
        f"<@{alice.id}> I can't take big.txt: it is 3 KB and my limit is 2 KB.",
    ]
    assert discord_bot.llm.requests == []


# -- slash commands --------------------------------------------------------------


async def test_memory_answers_only_the_asker_with_what_the_bot_holds(discord_bot: Harness) -> None:
    alice, general = discord_bot.member("alice"), discord_bot.channel("general")
    await discord_bot.slash("memory", alice, general)
    assert discord_bot.http.texts() == [NOTHING_HELD]
    assert all(call.ephemeral for call in discord_bot.http.calls)

    discord_bot.llm.script(
        reply_tool_calls(
            tool_call(
                "core_memory_append", {"name": "human", "content": "Grows tomatoes.", "request_heartbeat": False}
            ),
            tool_call("send_message", {"message": "Noted."}),
        )
    )
    dm = await alice.create_dm()
    await dpytest.message("I grow tomatoes", channel=dm, member=alice)
    sent()
    discord_bot.http.calls.clear()
    await discord_bot.slash("memory", alice, dm)
    [report] = discord_bot.http.texts()
    assert report.startswith("What I hold on you: ") and "Messages: " in report
    [note] = [line for line in report.splitlines() if "Note: Grows tomatoes." in line]
    assert "learned in your DMs" in note
    assert [call.ephemeral for call in discord_bot.http.calls] == [True, True]  # the deferral, then the ledger

    # Each item has its button; pressing one forgets that item only.
    number = note.split(".", 1)[0]
    await discord_bot.press(f"Forget {number}", alice, dm)
    assert discord_bot.http.texts()[-1].startswith("Forgotten: 0 messages, 0 saved passages, 1 note")
    agent_id = await discord_bot.agent_id(alice)
    assert agent_id is not None
    blocks = await discord_bot.runtime.store.load_blocks(agent_id)
    assert "tomatoes" not in " ".join(block.value for block in blocks)


async def test_checkin_sets_a_schedule_delivered_to_the_dm(discord_bot: Harness) -> None:
    alice, general = discord_bot.member("alice"), discord_bot.channel("general")
    await discord_bot.slash("checkin", alice, general, command="daily 09:00")
    [answer] = discord_bot.http.texts()
    assert "09:00" in answer
    assert all(call.ephemeral for call in discord_bot.http.calls)
    [schedule] = await discord_bot.runtime.schedules.list_for_user(f"discord:{alice.id}")
    assert schedule.kind == "daily" and schedule.reply_to["user_id"] == alice.id
    assert schedule.reply_to["channel_id"] is None  # the DM, not the channel it was typed in
    discord_bot.http.calls.clear()
    await discord_bot.slash("checkin", alice, general, command="list")
    assert schedule.id in discord_bot.http.texts()[0]


async def test_forget_asks_first_and_deletes_only_on_confirmation(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("Noted."))
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    await dpytest.message("remember that I like roses", channel=dm, member=alice)
    sent()

    await discord_bot.slash("forget", alice, dm)
    assert discord_bot.http.texts() == [FORGET_QUESTION]
    assert set(discord_bot.http.buttons()[1]) == {"Delete everything", "Cancel"}
    await discord_bot.press("Cancel", alice, dm)
    assert discord_bot.http.texts()[-1] == FORGET_CANCELLED
    assert await discord_bot.agent_id(alice) is not None

    discord_bot.http.calls.clear()
    await discord_bot.slash("forget", alice, dm)
    await discord_bot.press("Delete everything", alice, dm)
    assert discord_bot.http.texts() == [FORGET_QUESTION, FORGET_WORKING, FORGET_DONE]
    assert await discord_bot.agent_id(alice) is None


async def test_forget_about_shows_the_matches_and_deletes_only_them_on_confirmation(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("Noted."))
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    await dpytest.message("my passport number is XK-88213", channel=dm, member=alice)
    await dpytest.message("I like roses", channel=dm, member=alice)
    sent()

    await discord_bot.slash("forget", alice, dm, about="passport XK-88213")
    await settle()
    [question] = discord_bot.http.texts()
    assert question.startswith("About 'passport XK-88213' I hold ") and "XK-88213" in question
    assert set(discord_bot.http.buttons()[1]) == {"Delete all of this", "Cancel"}
    agent_id = await discord_bot.agent_id(alice)
    assert agent_id is not None
    await discord_bot.press("Delete all of this", alice, dm)
    await settle()
    assert discord_bot.http.texts()[-1].startswith("Forgotten: ")
    left = [m.searchable_text() for m in await discord_bot.runtime.store.messages_since(agent_id, 0)]
    assert not [text for text in left if "XK-88213" in text] and any("roses" in text for text in left)


@pytest.mark.parametrize("discord_bot", [0.05], indirect=True)  # the view's timeout, in seconds
async def test_forget_times_out_without_deleting(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("Noted."))
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    await dpytest.message("remember me", channel=dm, member=alice)
    sent()
    await discord_bot.slash("forget", alice, dm)
    await asyncio.sleep(0.2)
    await settle()
    assert discord_bot.http.texts() == [FORGET_QUESTION, FORGET_TIMED_OUT]
    assert discord_bot.http.calls[-1].method == "PATCH"  # the question itself is edited
    assert await discord_bot.agent_id(alice) is not None


def test_a_long_memory_report_is_split_and_cut_to_five_messages() -> None:
    report = "\n".join(f"line {i}: " + "tomatoes " * 20 for i in range(200))
    messages = split_at_most(report, 2_000)
    assert len(messages) == 5 and all(len(m) <= 2_000 for m in messages)
    assert messages[-1].endswith(TRUNCATED)


# -- configuration ---------------------------------------------------------------


def test_config_from_env() -> None:
    assert DiscordConfig.from_env({}) is None
    assert DiscordConfig.from_env({"DISCORD_TOKEN": "  "}) is None
    config = DiscordConfig.from_env({"DISCORD_TOKEN": "secret", "DISCORD_ALWAYS_ON_CHANNELS": "123, 456,"})
    assert config is not None
    assert config.always_on_channels == {123, 456} and not config.sharded and config.command_guild_id is None
    assert config.max_upload_bytes == 5 * 1024 * 1024
    assert "secret" not in repr(config)
    auto = DiscordConfig.from_env(
        {
            "DISCORD_TOKEN": "t",
            "DISCORD_SHARD_COUNT": "auto",
            "DISCORD_COMMAND_GUILD_ID": "99",
            "DISCORD_MAX_UPLOAD_BYTES": "1000",
        }
    )
    assert auto is not None and auto.sharded and auto.shard_count is None
    assert auto.command_guild_id == 99 and auto.max_upload_bytes == 1000
    fixed = DiscordConfig.from_env({"DISCORD_TOKEN": "t", "DISCORD_SHARD_COUNT": "4", "DISCORD_SHARD_IDS": "0,1"})
    assert fixed is not None and fixed.shard_count == 4 and fixed.shard_ids == (0, 1)
    for bad in (
        {"DISCORD_ALWAYS_ON_CHANNELS": "general"},
        {"DISCORD_SHARD_COUNT": "0"},
        {"DISCORD_SHARD_IDS": "0"},
        {"DISCORD_SHARD_COUNT": "2", "DISCORD_SHARD_IDS": "2"},
        {"DISCORD_MAX_UPLOAD_BYTES": "5MB"},
    ):
        with pytest.raises(ConfigError):
            DiscordConfig.from_env({"DISCORD_TOKEN": "t", **bad})


async def test_the_client_asks_only_for_the_intents_it_uses(make_runtime: RuntimeFactory) -> None:
    runtime = await make_runtime()
    plain = DiscordAdapter(runtime, DiscordConfig(token="t"))
    wanted = {"guilds", "guild_messages", "dm_messages", "message_content", "members"}
    assert {name for name, on in plain.client.intents if on} == wanted
    assert not isinstance(plain.client, discord.AutoShardedClient)
    sharded = DiscordAdapter(runtime, DiscordConfig(token="t", sharded=True, shard_count=2, shard_ids=(1,)))
    assert isinstance(sharded.client, discord.AutoShardedClient)
    assert sharded.client.shard_count == 2 and sharded.client.shard_ids == [1]
    assert {command.name for command in plain.tree.get_commands()} == {"memory", "forget", "checkin", "channel"}


class CommandsHTTP:
    """The two REST calls CommandTree.sync makes, answered like Discord."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.synced: list[tuple[int | None, list[dict[str, Any]]]] = []

    def _answer(self, guild_id: int | None, payload: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.fail:
            raise discord.HTTPException(backend.FakeRequest(429, "Too Many Requests"), "rate limited")
        self.synced.append((guild_id, payload))
        return [
            {
                "id": str(next(snowflakes)),
                "application_id": "1234",
                "version": "1",
                "default_member_permissions": None,
                **command,
            }
            for command in payload
        ]

    async def bulk_upsert_global_commands(self, application_id: int, payload: list[dict[str, Any]]) -> Any:
        return self._answer(None, payload)

    async def bulk_upsert_guild_commands(
        self, application_id: int, guild_id: int, payload: list[dict[str, Any]]
    ) -> Any:
        return self._answer(guild_id, payload)


async def test_slash_commands_sync_to_one_server_or_globally(
    make_runtime: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = await make_runtime()
    for guild_id in (99, None):
        adapter = DiscordAdapter(runtime, DiscordConfig(token="t", command_guild_id=guild_id))
        adapter.client._connection.application_id = 1234  # set at login
        adapter.tree._http = http = CommandsHTTP()  # type: ignore[assignment]
        await adapter.sync_commands()
        [(synced_to, payload)] = http.synced
        assert synced_to == guild_id
        assert {command["name"] for command in payload} == {"memory", "forget", "checkin", "channel"}
        assert all(command["contexts"] == [0, 1] for command in payload)  # servers and DMs with the bot

    adapter.tree._http = CommandsHTTP(fail=True)  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="adapters.discord"):
        await adapter.sync_commands()  # logged, not raised: the bot still answers messages
    assert "could not sync slash commands" in caplog.text
