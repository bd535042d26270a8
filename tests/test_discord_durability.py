"""Crash safety on Discord (bot/durable/): events recorded in the inbox before work and redone at
restart, replies reported, retried and never sent twice.

The same set-up as tests/test_discord_adapter.py: dpytest drives discord.py's real
dispatch, behind the adapter runs a real Runtime on SQLite and the scripted LLM
server. A crash is a cancellation where the process would die (discord.py swallows a
handler's CancelledError, so nothing after that point runs, as after a SIGKILL). A
restart is a new Runtime and adapter on the same data directory; the Discord side
(dpytest's fake platform, bound to the first client) outlives the bot process, so
the restarted adapter takes that client over.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import discord
import discord.ext.test as dpytest
import pytest
from discord.ext.test import backend

from adapters.discord import DiscordAdapter, nonce_of
from bot.durable.lanes import Turn
from bot.durable.redelivery import Redelivery
from bot.events import Event, UserMessage
from bot.events import Reply as BotReply
from bot.runtime import Runtime
from memory.store import StoreError
from tests import test_discord_adapter as base
from tests.conftest import RuntimeFactory
from tests.fake_llm import reply_tool_calls, say, tool_call
from tests.recording_bot import RecordingBot
from tests.test_discord_adapter import Harness, in_dm_with, last_user_text, sent

discord_bot = base.discord_bot  # the shared harness fixture

SendHook = Callable[[Any], Awaitable[None]]


def around_sends(harness: Harness, before: SendHook | None = None, after: SendHook | None = None) -> list[Any]:
    """Run hooks around each send at dpytest's HTTP layer (a hook may raise: Discord's
    answer, or the process dying). dpytest reads `channel` from its caller's frame, so the
    wrapper keeps that local for it. Returns the channels sends were attempted to."""
    http = harness.client.http
    original = type(http).send_message.__get__(http)
    attempts: list[Any] = []

    async def wrapper(channel_id: int, **kwargs: Any) -> Any:
        channel = sys._getframe(1).f_locals["channel"]
        attempts.append(channel)
        if before is not None:
            await before(channel)
        result = await original(channel_id, **kwargs)
        if after is not None:
            await after(channel)
        return result

    http.send_message = wrapper  # type: ignore[method-assign]
    return attempts


def stop_patching_sends(harness: Harness) -> None:
    vars(harness.client.http).pop("send_message", None)


async def die(channel: Any) -> None:
    raise asyncio.CancelledError  # the process is killed right here


def server_error() -> discord.DiscordServerError:
    return discord.DiscordServerError(backend.FakeRequest(500, "Internal Server Error"), "internal error")


def cannot_dm() -> discord.Forbidden:
    return discord.Forbidden(
        backend.FakeRequest(403, "Forbidden"), {"code": 50007, "message": "Cannot send messages to this user"}
    )


def restarted(harness: Harness, bot: Any) -> DiscordAdapter:
    """A new adapter for `bot`, taking over the client dpytest's platform is bound to."""
    adapter = DiscordAdapter(bot, harness.adapter.config)
    adapter.client = harness.client
    for handler in (adapter.on_ready, adapter.on_message, adapter.on_member_join):
        harness.client.event(handler)
    return adapter


async def restart(harness: Harness, make_runtime: RuntimeFactory) -> tuple[Runtime, DiscordAdapter]:
    runtime = await make_runtime(context_window=32_768)  # the same data directory as the harness
    return runtime, restarted(harness, runtime)


async def outbox_states(runtime: Runtime, event_id: str) -> list[str]:
    return [entry.state for entry in await runtime.store.outbox_for_event(event_id)]


async def user_lines(runtime: Runtime, user: discord.abc.User, text: str) -> int:
    """How many times a user message containing `text` is in the user's recall storage."""
    record = await runtime.store.find_agent(f"discord:{user.id}")
    assert record is not None
    messages = await runtime.store.messages_since(record.id, 0)
    return sum(1 for message in messages if message.role == "user" and text in message.content)


async def kill_handlers() -> None:
    """Cancel the adapter's handler tasks where they stand: a SIGKILL as the bot sees it."""
    tasks = [task for task in asyncio.all_tasks() if task.get_name().startswith("discord.py: on_") and not task.done()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- the inbox: recorded before any work, redone once at restart -------------------


async def test_a_message_cut_short_by_a_crash_is_redone_once_at_restart(
    discord_bot: Harness, make_runtime: RuntimeFactory
) -> None:
    runtime = discord_bot.runtime
    pending_at_handle: list[list[str]] = []
    handle = runtime.handle

    async def recording_handle(event: Event, turn: Turn | None = None) -> list[BotReply]:
        pending_at_handle.append([entry.event_id for entry in await runtime.store.inbox_pending("discord")])
        assert event.in_inbox
        return await handle(event, turn)

    runtime.handle = recording_handle  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    model_called, model_answers = asyncio.Event(), threading.Event()

    def slow_model(request: dict[str, Any]) -> Any:  # runs in the LLM server's thread
        loop.call_soon_threadsafe(model_called.set)
        model_answers.wait(5)  # the LLM call in flight when the process dies
        return say("You will never see this.")

    discord_bot.llm.set_handler(slow_model)
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    message = backend.make_message("what should I sow in March?", alice, dm)  # dispatched, not awaited
    await asyncio.wait_for(model_called.wait(), 5)
    await kill_handlers()
    model_answers.set()

    assert pending_at_handle == [[str(message.id)]]  # recorded in the inbox before the bot saw it
    [entry] = await runtime.store.inbox_pending("discord")
    assert entry.payload == {
        "kind": "message",
        "event_id": str(message.id),
        "user_id": str(alice.id),
        "channel_id": str(dm.id),
        "guild_id": None,
        "message_id": str(message.id),
        "place": {"key": "dm", "name": "", "thread": ""},  # a replay files it where it was said
    }
    assert sent() == []

    discord_bot.llm.set_handler(lambda request: say("Sow tomatoes indoors in March."))
    runtime2, adapter = await restart(discord_bot, make_runtime)
    assert await adapter.recover() == 1

    [reply] = sent()
    assert reply.content == "Sow tomatoes indoors in March." and in_dm_with(reply, alice)
    assert reply.nonce == nonce_of(f"{message.id}:0", 0)
    assert len(discord_bot.llm.requests) == 2  # the cut-short call, then the redo
    assert last_user_text(discord_bot.llm.requests[-1]).endswith("alice in DM: what should I sow in March?")
    assert await user_lines(runtime2, alice, "what should I sow in March?") == 1
    assert await runtime2.store.inbox_pending("discord") == []
    assert await outbox_states(runtime2, str(message.id)) == ["sent"]
    assert await adapter.recover() == 0 and sent() == []  # nothing left to redo


async def test_a_reply_recorded_but_not_sent_before_a_crash_is_sent_once_without_asking_the_model(
    discord_bot: Harness, make_runtime: RuntimeFactory
) -> None:
    discord_bot.llm.set_handler(lambda request: say("Sow peas in February."))
    around_sends(discord_bot, before=die)  # killed while sending: the reply is in the outbox
    alice = discord_bot.member("alice")
    message = await dpytest.message("when do peas go in?", channel=await alice.create_dm(), member=alice)
    assert sent() == []
    assert await outbox_states(discord_bot.runtime, str(message.id)) == ["pending"]
    stop_patching_sends(discord_bot)

    runtime2, adapter = await restart(discord_bot, make_runtime)
    assert await adapter.recover() == 1
    assert [m.content for m in sent()] == ["Sow peas in February."]
    assert len(discord_bot.llm.requests) == 1  # answered from the outbox, not again by the model
    assert await outbox_states(runtime2, str(message.id)) == ["sent"]
    assert await user_lines(runtime2, alice, "when do peas go in?") == 1
    assert await runtime2.store.inbox_pending("discord") == []


async def test_a_reply_that_reached_discord_before_the_crash_is_not_sent_again(
    discord_bot: Harness, make_runtime: RuntimeFactory
) -> None:
    long = " ".join(f"Sentence {i} about sowing beans." for i in range(100))  # two parts
    discord_bot.llm.set_handler(lambda request: say(long))
    around_sends(discord_bot, after=die)  # the first part is on Discord; the bot dies before it knows
    alice, general = discord_bot.member("alice"), discord_bot.channel("general")
    message = await dpytest.message(f"<@{discord_bot.me.id}> beans?", channel=general, member=alice)
    [first] = sent()
    outbox_id = f"{message.id}:0"
    assert first.nonce == nonce_of(outbox_id, 0) and first.content.startswith(f"<@{alice.id}> Sentence 0")
    stop_patching_sends(discord_bot)
    # Messages read back from Discord's history carry no nonce: the resend check must match by content.
    for stored in backend._cur_config.messages[general.id]:
        stored.pop("nonce", None)

    runtime2, adapter = await restart(discord_bot, make_runtime)
    assert await adapter.recover() == 1
    [second] = sent()  # only the part that had not gone out
    assert second.nonce == nonce_of(outbox_id, 1)
    assert second.content.startswith("Sentence ") and second.content.endswith("Sentence 99 about sowing beans.")
    assert len(discord_bot.llm.requests) == 1
    assert await outbox_states(runtime2, str(message.id)) == ["sent"]


# -- delivery outcomes ----------------------------------------------------------------


async def test_a_send_that_fails_with_500_is_retried_later_by_the_outbox_retrier(discord_bot: Harness) -> None:
    runtime = discord_bot.runtime
    discord_bot.llm.set_handler(lambda request: say("Here is my answer."))
    failures = [server_error()]

    async def fail_once(channel: Any) -> None:
        if failures:
            raise failures.pop()

    around_sends(discord_bot, before=fail_once)
    alice = discord_bot.member("alice")
    message = await dpytest.message("are you there?", channel=await alice.create_dm(), member=alice)
    assert sent() == []
    [entry] = await runtime.store.outbox_for_event(str(message.id))
    assert (entry.state, entry.attempts) == ("pending", 1) and entry.next_try_at > time.time()
    assert await runtime.store.inbox_pending("discord") == []  # handed to the retrier: done

    retrier = Redelivery(runtime.inbox, runtime.outbox, {"discord": discord_bot.adapter.deliver})
    assert await retrier.run_once() == 0  # its backoff is not over
    runtime.outbox.clock = lambda: time.time() + 60
    assert await retrier.run_once() == 1
    [reply] = sent()
    assert reply.content == "Here is my answer." and in_dm_with(reply, alice)
    assert await outbox_states(runtime, str(message.id)) == ["sent"]
    assert await retrier.run_once() == 0 and sent() == []
    assert len(discord_bot.llm.requests) == 1


async def test_after_a_failure_the_persons_later_replies_wait_and_go_out_in_order(discord_bot: Harness) -> None:
    runtime = discord_bot.runtime
    discord_bot.llm.script(
        reply_tool_calls(
            tool_call("send_message", {"message": "First."}, call_id="a"),
            tool_call("send_message", {"message": "Second."}, call_id="b"),
        )
    )
    failures = [server_error()]

    async def fail_once(channel: Any) -> None:
        if failures:
            raise failures.pop()

    attempts = around_sends(discord_bot, before=fail_once)
    alice = discord_bot.member("alice")
    message = await dpytest.message("tell me two things", channel=await alice.create_dm(), member=alice)
    assert len(attempts) == 1 and sent() == []  # "Second." was not tried after "First." failed
    entries = await runtime.store.outbox_for_event(str(message.id))
    assert [(e.text, e.state, e.attempts) for e in entries] == [("First.", "pending", 1), ("Second.", "pending", 1)]

    runtime.outbox.clock = lambda: time.time() + 60
    assert await Redelivery(runtime.inbox, runtime.outbox, {"discord": discord_bot.adapter.deliver}).run_once() == 2
    assert [m.content for m in sent()] == ["First.", "Second."]
    assert await outbox_states(runtime, str(message.id)) == ["sent", "sent"]


async def test_a_retried_reply_is_not_overtaken_by_the_persons_next_answer(discord_bot: Harness) -> None:
    """Across events too: while "First." waits for its retry, the answer to the next message waits behind it."""
    runtime = discord_bot.runtime
    discord_bot.llm.set_handler(lambda request: say("re: " + last_user_text(request).rsplit(" ", 1)[-1]))
    failures = [server_error()]

    async def fail_once(channel: Any) -> None:
        if failures:
            raise failures.pop()

    attempts = around_sends(discord_bot, before=fail_once)
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()
    await dpytest.message("number one", channel=dm, member=alice)
    await dpytest.message("number two", channel=dm, member=alice)
    assert len(attempts) == 1 and sent() == []  # "re: two" was not tried
    runtime.outbox.clock = lambda: time.time() + 60
    assert await Redelivery(runtime.inbox, runtime.outbox, {"discord": discord_bot.adapter.deliver}).run_once() == 2
    assert [m.content for m in sent()] == ["re: one", "re: two"]
    await dpytest.message("number three", channel=dm, member=alice)
    assert [m.content for m in sent()] == ["re: three"]
    assert len(discord_bot.runtime.doors.lanes) == 0


async def test_a_person_who_closed_their_dms_gets_the_reply_dropped_not_retried(
    discord_bot: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = discord_bot.runtime
    discord_bot.llm.set_handler(lambda request: say("A secret answer."))

    async def closed_dms(channel: Any) -> None:
        if isinstance(channel, discord.DMChannel):
            raise cannot_dm()

    attempts = around_sends(discord_bot, before=closed_dms)
    alice = discord_bot.member("alice")
    with caplog.at_level(logging.INFO):
        message = await dpytest.message("hello", channel=await alice.create_dm(), member=alice)
    assert sent() == []
    assert await outbox_states(runtime, str(message.id)) == ["dropped"]
    [record] = [r for r in caplog.records if r.name == "adapters.discord.send" and r.levelno >= logging.WARNING]
    line = record.getMessage()
    assert str(alice.id) in line and "50007" in line and "dropped" in line
    assert "A secret answer" not in caplog.text  # who and why, never what

    runtime.outbox.clock = lambda: time.time() + 3_600
    assert await Redelivery(runtime.inbox, runtime.outbox, {"discord": discord_bot.adapter.deliver}).run_once() == 0
    assert len(attempts) == 1 and sent() == []


# -- replays that find the world changed, joins, bots without an inbox ---------------


async def test_a_message_deleted_before_the_restart_is_not_redone(
    discord_bot: Harness, make_runtime: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    discord_bot.llm.set_handler(lambda request: say("Never sent."))
    alice = discord_bot.member("alice")
    dm = await alice.create_dm()

    async def dead(event: Event, turn: Turn | None = None) -> list[BotReply]:
        raise asyncio.CancelledError

    discord_bot.runtime.handle = dead  # type: ignore[method-assign]
    message = await dpytest.message("oops, wrong chat", channel=dm, member=alice)
    assert len(await discord_bot.runtime.store.inbox_pending("discord")) == 1
    backend.delete_message(message)

    runtime2, adapter = await restart(discord_bot, make_runtime)
    with caplog.at_level(logging.WARNING, logger="adapters.discord"):
        assert await adapter.recover() == 1
    assert f"not redoing message {message.id}" in caplog.text
    assert sent() == [] and discord_bot.llm.requests == []
    assert await runtime2.store.inbox_pending("discord") == []


async def test_a_join_cut_short_is_redone_from_its_inbox_entry(
    discord_bot: Harness, make_runtime: RuntimeFactory
) -> None:
    async def dead(event: Event, turn: Turn | None = None) -> list[BotReply]:
        raise asyncio.CancelledError

    discord_bot.runtime.handle = dead  # type: ignore[method-assign]
    maya = await dpytest.member_join(discord_bot.guild, name="Maya")
    await dpytest.run_all_events()
    [entry] = await discord_bot.runtime.store.inbox_pending("discord")
    assert entry.payload["kind"] == "join" and entry.payload["display_name"] == "Maya"
    assert entry.payload["guild_name"] == "Gardeners"

    discord_bot.llm.set_handler(lambda request: say("Welcome, Maya!"))
    runtime2, adapter = await restart(discord_bot, make_runtime)
    assert await adapter.recover() == 1
    [greeting] = sent()
    assert greeting.content == "Welcome, Maya!" and in_dm_with(greeting, maya)
    assert "[event] Maya joined the Gardeners server." in last_user_text(discord_bot.llm.requests[0])
    assert await outbox_states(runtime2, entry.event_id) == ["sent"]
    assert await runtime2.store.inbox_pending("discord") == []


class InboxDown(RecordingBot):
    """A bot whose inbox cannot take anything (its store is down)."""

    async def receive(self, platform: str, event_id: str, user_id: str, payload: dict[str, Any]) -> bool:
        raise StoreError("the store is down")

    async def handle(self, event: Event, turn: Turn | None = None) -> list[BotReply]:
        self.events.append(event)
        assert isinstance(event, UserMessage)
        return [event.reply(f"echo: {event.text}")]


async def test_a_message_the_inbox_cannot_take_is_answered_without_crash_recovery(discord_bot: Harness) -> None:
    # Discord never sends a gateway event again: answering beats staying silent.
    bot = InboxDown()
    restarted(discord_bot, bot)
    alice = discord_bot.member("alice")
    await dpytest.message("ping", channel=await alice.create_dm(), member=alice)
    assert [m.content for m in sent()] == ["echo: ping"]
    [event] = bot.events
    assert not event.in_inbox
