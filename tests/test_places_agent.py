"""The agent in several places: the private block, per-place prompt caches,
reminders set in a channel, /memory, and the CLI's view by place (real SQLite,
real HTTP to the scripted model, real embeddings)."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

from bot.events import ChannelLine, ScheduledTick, UserMessage
from bot.reports import render_description
from memory.places import DM, Place
from memory.types import utc_now
from memory.working_context import PRIVATE_BLOCK, default_blocks
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, Reply, reply_tool_calls, tool_call
from tests.places_script import scripted_model
from tests.test_cli import base_env, memgpt, ok

PUBLIC = Place("public", "C1", "#general")
TEAM = Place("private", "G1", "#team")


def said(text: str, place: Place, **extra: Any) -> UserMessage:
    return UserMessage(platform="slack", user_id="T1:U1", text=text, place=place, **extra)


def results(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for body in bodies for m in body["messages"] if m["role"] == "tool"]


async def test_the_private_block_is_shown_and_edited_only_in_dms(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(scripted_model)
    runtime = await make_runtime()
    await runtime.handle(said("CMD private on medication zqvpills", DM))
    dm_body = llm_server.requests[-1]
    # The edit is in the DM's queue at once (the call and its result); the system message,
    # which shows the private block, takes it at the DM's next flush.
    assert "<private" in dm_body["messages"][0]["content"] and "zqvpills" in json.dumps(dm_body["messages"][1:])
    assert results([dm_body])[-1]["status"] == "OK"
    agent = await runtime.agent("slack:T1:U1")
    assert "zqvpills" in agent.working_context.render(DM)

    before = len(llm_server.requests)
    await runtime.handle(said("CMD private the band plays on friday", PUBLIC))
    bodies = llm_server.requests[before:]
    assert all("<private" not in body["messages"][0]["content"] for body in bodies)
    assert "<human" in bodies[0]["messages"][0]["content"]  # the rest of working context is there
    failed = results(bodies)[-1]
    assert failed["status"] == "Failed" and "only in a direct message" in failed["result"]
    agent = await runtime.agent("slack:T1:U1")
    assert "friday" not in agent.working_context.get(PRIVATE_BLOCK).value


async def test_an_agent_from_before_places_gets_the_private_block(make_runtime: RuntimeFactory) -> None:
    runtime = await make_runtime()
    old_blocks = [b for b in default_blocks(2_000, 2_000) if b.label != PRIVATE_BLOCK]
    record, _ = await runtime.store.get_or_create_agent("slack:T1:U9", old_blocks)
    agent = await runtime.agent("slack:T1:U9")
    assert agent.working_context.get(PRIVATE_BLOCK).limit == runtime.settings.private_limit
    assert PRIVATE_BLOCK in {b.label for b in await runtime.store.load_blocks(record.id)}


async def test_each_place_keeps_a_stable_prompt_prefix(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    """Alternating places (and a mention with channel lines) never rewrites a
    place's earlier prompt: each request of a place starts with the previous
    one's messages, the status of its newest aside."""
    llm_server.set_handler(scripted_model)
    runtime = await make_runtime()
    lines = [ChannelLine(author="bob", text=f"line {n} about lunch", created_at=utc_now()) for n in range(20)]
    sequence = [DM, PUBLIC, DM, TEAM, PUBLIC, DM, PUBLIC]
    by_place: dict[str, list[list[dict[str, Any]]]] = {}
    for turn, place in enumerate(sequence):
        before = len(llm_server.requests)
        context = lines if place == PUBLIC and turn == 1 else []
        await runtime.handle(said(f"CMD say turn {turn}", place, channel_context=context))
        by_place.setdefault(place.key, []).extend(body["messages"] for body in llm_server.requests[before:])
    for key, prompts in by_place.items():
        for earlier, later in itertools.pairwise(prompts):
            assert later[0] == earlier[0], f"{key}: the system message changed"
            assert later[1 : len(earlier) - 1] == earlier[1:-1], f"{key}: an earlier message changed"
    assert "line 19 about lunch" not in json.dumps(by_place[PUBLIC.key][-1])


async def test_a_reminder_set_in_a_channel_is_delivered_to_the_dm(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    def model(request: dict[str, Any]) -> Reply:
        if request["messages"][-1]["role"] == "tool":
            return reply_tool_calls(tool_call("send_message", {"message": "Done."}))
        args = {"when": "in 3 hours", "note": "ask about the dentist", "request_heartbeat": True}
        return reply_tool_calls(tool_call("schedule_reminder", args))

    llm_server.set_handler(model)
    runtime = await make_runtime()
    dm = {"dm_user": "U1"}
    await runtime.handle(said("remind me", PUBLIC, reply_to={"channel": "C1"}, dm_reply_to=dm))
    [reminder] = await runtime.schedules.list_for_user("slack:T1:U1")
    assert reminder.reply_to == dm
    # Without a way to reach the DM, the model is told to ask for it there.
    await runtime.handle(said("remind me", TEAM, reply_to={"channel": "G1"}))
    assert "direct message" in results(llm_server.requests[-1:])[-1]["result"]
    # The tick wakes the agent in the DM: what it records is DM-only.
    llm_server.set_handler(lambda request: reply_tool_calls(tool_call("send_message", {"message": "Dentist?"})))
    [reply] = await runtime.handle(
        ScheduledTick(platform="slack", user_id="T1:U1", reply_to=reminder.reply_to, reason="ask about the dentist")
    )
    assert reply.reply_to == dm
    agent = await runtime.agent("slack:T1:U1")
    tick = [m for m in await runtime.store.messages_since(agent.id, 0) if m.name == "scheduled_tick"]
    assert [m.place for m in tick] == ["dm"]


async def test_memory_report_says_what_is_private_and_what_is_shared(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(scripted_model)
    runtime = await make_runtime()
    await runtime.handle(said("CMD save my locker code is zqv1", DM))
    await runtime.handle(said("CMD say hello all", PUBLIC))
    before = len(llm_server.requests)
    await runtime.handle(said("CMD find hello", DM))
    assert "(in #general)" in json.dumps(results(llm_server.requests[before:])), "search results say where"
    description = await runtime.describe("slack:T1:U1")
    assert description is not None
    report = render_description(description)
    assert "Direct messages (private: only your DMs with me see this)" in report
    assert "Public channel #general (shared: seen wherever you talk to me) [public:C1]" in report
    assert "1 saved passage" in report and "[private] (private)" in report


async def test_cli_memory_show_and_search_by_place(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    llm_server.set_handler(scripted_model)
    # `chat` has no places: the memory is built through the runtime, as the adapters would.
    runtime = await make_runtime(tmp_path / "data")
    await runtime.handle(said("CMD say my vault code is zqvdm", DM))
    await runtime.handle(said("CMD say the lunch code is zqvpub", PUBLIC))
    env = base_env(llm_server.base_url, tmp_path / "data")
    user = ("--user", "slack:T1:U1")

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(memgpt, *args, env=env, cwd=tmp_path)

    shown = json.loads(ok(await cli("memory", "show", *user, "--json")))
    places = {c["place"]: c for c in shown["conversations"]}
    assert set(places) == {"dm", "public:C1"} and places["public:C1"]["name"] == "#general"
    assert places["dm"]["queue_messages"] >= 2 and places["public:C1"]["messages"] >= 2

    async def search(*place: str) -> str:
        return ok(await cli("memory", "search", *user, "--recall", "code", *place, "--json"))

    everything = await search()
    assert "zqvdm" in everything and "zqvpub" in everything
    from_channel = await search("--place", "public:C1")
    assert "zqvpub" in from_channel and "zqvdm" not in from_channel
    bad = await cli("memory", "search", *user, "--recall", "x", "--place", "channel:9")
    assert bad.returncode != 0 and "not a place" in bad.stderr
