"""The runtime's contract: one agent per (platform, user), events of one agent
in arrival order, different agents concurrently, every event kind rendered."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import UTC, datetime
from typing import Any

from bot.events import FileUploaded, ScheduledTick, UserJoined, UserMessage
from memory.types import Message, Passage
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, InFlightProbe, Reply, fault_status, reply_tool_calls, tool_call


def echo_turn(request: dict[str, Any]) -> Reply:
    said = [m["content"] for m in request["messages"] if m["role"] == "user"]
    number = re.findall(r"number (\d+)", said[-1])
    return reply_tool_calls(tool_call("send_message", {"message": f"reply to {number[-1] if number else '?'}"}))


async def test_one_users_messages_are_answered_in_order(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    probe = InFlightProbe(echo_turn)
    llm_server.set_handler(probe)
    runtime = await make_runtime()
    events = [UserMessage(platform="discord", user_id="42", text=f"message number {i}") for i in range(10)]
    results = await asyncio.gather(*(runtime.handle(event) for event in events))
    assert [[r.text for r in replies] for replies in results] == [[f"reply to {i}"] for i in range(10)]
    assert probe.most == 1
    agent = await runtime.agent("discord:42")
    stored = await runtime.store.messages_since(agent.id, 0)
    user_lines = [m.content for m in stored if m.role == "user"]
    assert [re.findall(r"number (\d+)", line)[0] for line in user_lines] == [str(i) for i in range(10)]


async def test_different_users_run_concurrently(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    # The first three requests only get an answer once all three are in flight at once:
    # a runtime that served users one by one would break the barrier.
    barrier = threading.Barrier(3, timeout=10)

    def model(request: dict[str, Any]) -> Reply:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return fault_status(500, body="users were not served concurrently", headers={"x-should-retry": "false"})
        return echo_turn(request)

    llm_server.set_handler(model)
    runtime = await make_runtime(llm_max_retries=0)
    results = await asyncio.gather(
        *(runtime.handle(UserMessage(platform="slack", user_id=f"T1:U{i}", text=f"number {i}")) for i in range(3))
    )
    assert [[r.text for r in replies] for replies in results] == [[f"reply to {i}"] for i in range(3)]
    ids = {(await runtime.agent(f"slack:T1:U{i}")).id for i in range(3)}
    assert len(ids) == 3


async def test_every_event_kind_reaches_the_model_as_text(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(lambda request: reply_tool_calls(tool_call("send_message", {"message": "ok"})))
    runtime = await make_runtime()
    base = {"platform": "discord", "user_id": "7"}
    await runtime.handle(UserJoined(**base, display_name="Maya", joined="the Gardening server"))
    await runtime.handle(
        ScheduledTick(
            **base, reason="Daily check-in", local_time="Mon 09:00 Europe/Paris", since_last_conversation="2 days"
        )
    )
    handbook = "# Watering\n\nWater tomatoes at dawn, never at noon.\n\n# Soil\n\nUse compost rich in nitrogen."
    replies = await runtime.handle(
        FileUploaded(**base, filename="garden.md", data=handbook.encode(), display_name="Maya")
    )
    assert replies[0].text == "Saved garden.md to my memory (2 passages)."
    texts = [request["messages"][-1]["content"] for request in llm_server.requests]
    assert "Maya joined the Gardening server" in texts[0]
    assert "[scheduled tick] Daily check-in" in texts[1] and "Europe/Paris" in texts[1]
    assert "uploaded the file 'garden.md'" in texts[2] and "2 passages" in texts[2]
    agent = await runtime.agent("discord:7")
    found = await runtime.archival.search(agent.id, "when should I water my tomato plants?", 2)
    assert found.items[0][0].source == "garden.md"
    assert "dawn" in found.items[0][0].text
    assert found.items[0][0].position == "Watering"
    # The memory status tells the model what lives outside its window; it rides in
    # the newest message, not the system message (which a prompt cache must see unchanged).
    newest = llm_server.requests[-1]["messages"][-1]["content"]
    assert re.search(r"recall \d+ messages", newest)
    assert "archival 2 passages" in newest
    assert "archival 2 passages" not in llm_server.requests[-1]["messages"][0]["content"]


async def test_forget_removes_the_agent_and_a_new_one_starts_fresh(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(
        lambda request: reply_tool_calls(
            tool_call("core_memory_append", {"name": "human", "content": "Likes jazz.", "request_heartbeat": False})
        )
    )
    runtime = await make_runtime()
    await runtime.handle(UserMessage(platform="terminal", user_id="zoe", text="I like jazz"))
    exported = await runtime.export("terminal:zoe")
    assert exported is not None and "Likes jazz." in exported["working_context"]["human"]["value"]
    assert await runtime.forget("terminal:zoe")
    assert await runtime.export("terminal:zoe") is None
    agent = await runtime.agent("terminal:zoe")
    assert "jazz" not in agent.working_context.get("human").value
    assert await runtime.store.count_messages(agent.id) == 0


async def test_export_says_where_each_message_and_passage_was_said(make_runtime: RuntimeFactory) -> None:
    runtime = await make_runtime()
    agent = await runtime.agent("terminal:pia")
    await runtime.store.append_messages(
        agent.id, [Message("user", "in a DM"), Message("user", "in #general", place="public:C1")]
    )
    await runtime.store.insert_passages(agent.id, [Passage("team fact", place="private:C2")])
    await runtime.store.update_queue(agent.id, "chat in #general", 2, datetime.now(UTC), place="public:C1")
    exported = await runtime.export("terminal:pia")
    assert exported is not None
    assert [(m["content"], m["place"]) for m in exported["messages"]] == [
        ("in a DM", "dm"),
        ("in #general", "public:C1"),
    ]
    assert [(p["text"], p["place"]) for p in exported["passages"]] == [("team fact", "private:C2")]
    conversations = {c["place"]: c["summary"] for c in exported["conversations"]}
    assert conversations["public:C1"] == "chat in #general"
