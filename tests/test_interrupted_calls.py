"""A step's function calls are recorded before they run; a crash between the
calls and their results leaves calls without answers, which the next load
closes as "cut short" instead of running them blind again."""

from __future__ import annotations

import json
from pathlib import Path

from bot.agent import INTERRUPTED_RESULT, interrupted_calls
from bot.events import UserMessage
from memory.types import Message
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call


def call(call_id: str, name: str) -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_only_the_last_steps_unanswered_calls_are_interrupted() -> None:
    answered = Message(role="assistant", tool_calls=[call("a", "send_message")])
    tail = Message(role="assistant", tool_calls=[call("b", "core_memory_append"), call("c", "send_message")])
    history = [
        answered,
        Message(role="tool", tool_call_id="a", content="{}"),
        tail,
        Message(role="tool", tool_call_id="b", content="{}"),
    ]
    assert interrupted_calls(history) == [call("c", "send_message")]
    assert interrupted_calls(history[:2]) == []
    assert interrupted_calls([Message(role="user", content="hi")]) == []


async def test_a_restart_closes_calls_a_crash_left_open(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    runtime = await make_runtime(data)
    agent = await runtime.agent("terminal:alice")
    # What a kill between recording a step's calls and running them leaves behind.
    await agent.record_messages(
        [
            Message(role="user", content="remember my cat", name="user_message"),
            Message(role="assistant", tool_calls=[call("call_1", "core_memory_append")]),
        ]
    )
    await runtime.close(close_embedder=False)

    restarted = await make_runtime(data)
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "Where were we?"})))
    replies = await restarted.handle(UserMessage(platform="terminal", user_id="alice", text="hello?"))
    assert [reply.text for reply in replies] == ["Where were we?"]
    sent = llm_server.requests[-1]["messages"]
    # The model sees the call and an answer to it, and the API's rule holds: every call answered.
    index = next(i for i, m in enumerate(sent) if m.get("tool_calls"))
    result = sent[index + 1]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_1"
    assert json.loads(result["content"]) == {"status": "Failed", "result": INTERRUPTED_RESULT}
    # Closed once: a later restart finds nothing open.
    again = await restarted.agent("terminal:alice")
    assert interrupted_calls(await restarted.store.messages_since(again.id, 0)) == []
