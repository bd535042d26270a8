"""A scripted model and a leak scanner for the places tests (test tool only).

The person's messages are commands to the scripted model, so a test can say
what the agent does in each place:

- ``CMD say <text>``      answer "Heard you." (the text stays in recall)
- ``CMD save <text>``     archival_memory_insert(text)
- ``CMD private <text>``  core_memory_append("private", text)
- ``CMD human <text>``    core_memory_append("human", text) (``CMD persona``: the persona block)
- ``CMD share <text>``    core_memory_replace("human", text, text, everywhere=true)
- ``CMD find <query>``    conversation_search, conversation_search_date
  (yesterday to tomorrow: every recent message the store lets through) and
  archival_memory_search, all at once

A step after function results answers "Done."; a summarizer request gets a
"summary" that copies everything it was given, so whatever was said before a
flush is in that conversation's summary, word for word.

A secret is a *value* (a token like ``zqv3f9c2a``) said, saved, uploaded or
put in the private block in one place; its *handle* (the words around it) is
what searches ask for. `leaks` names each value found in a request body made
for an event whose place may not see the value's place (memory/places.py).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from bot.prompts import SUMMARIZER_INSTRUCTIONS
from memory.places import Place, Visibility
from memory.types import utc_now
from tests.fake_llm import Reply, ToolCall, reply_text, reply_tool_calls, tool_call

COMMAND = re.compile(r"CMD (say|save|private|human|persona|share|find) ([^\n]*)")
SUMMARIZER = SUMMARIZER_INSTRUCTIONS[:60]


def new_value() -> str:
    return "zqv" + secrets.token_hex(4)


def _newest_command(messages: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The command of the event this step answers: the newest user message
    with one, unless the agent already acted on it (an assistant message came after)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return None
        if message.get("role") == "user":
            found = COMMAND.findall(message.get("content") or "")
            if found:
                verb, text = found[-1]
                return verb, text.strip()
    return None


def scripted_model(request: dict[str, Any]) -> Reply:
    messages = request.get("messages") or []
    system = (messages[0].get("content") or "") if messages else ""
    if system.startswith(SUMMARIZER):
        given = messages[-1].get("content") or ""  # the agent cuts it to the summary's budget
        return reply_text("Summary of what was said: " + given.replace("\n", " "))
    if messages and messages[-1].get("role") == "tool":
        return reply_tool_calls(tool_call("send_message", {"message": "Done."}))
    command = _newest_command(messages)
    if command is None:
        return reply_tool_calls(tool_call("send_message", {"message": "Hello."}))
    verb, text = command
    if verb == "save":
        return reply_tool_calls(tool_call("archival_memory_insert", {"content": text, "request_heartbeat": True}))
    if verb in ("private", "human", "persona"):
        return reply_tool_calls(
            tool_call("core_memory_append", {"name": verb, "content": text, "request_heartbeat": True})
        )
    if verb == "share":
        return reply_tool_calls(
            tool_call(
                "core_memory_replace",
                {"name": "human", "old_content": text, "new_content": text}
                | {"everywhere": True, "request_heartbeat": True},
            )
        )
    if verb == "find":
        return reply_tool_calls(*search_everything(text))
    return reply_tool_calls(tool_call("send_message", {"message": "Heard you."}))


def search_everything(query: str) -> tuple[ToolCall, ...]:
    """Every search the agent has, at once: recall by words, recall by date
    (yesterday to tomorrow: every recent message the store lets through) and archival."""
    today = utc_now().date()
    return (
        tool_call("conversation_search", {"query": query, "request_heartbeat": True}),
        tool_call(
            "conversation_search_date",
            {
                "start_date": str(today - timedelta(days=1)),
                "end_date": str(today + timedelta(days=1)),
                "request_heartbeat": True,
            },
        ),
        tool_call("archival_memory_search", {"query": query, "request_heartbeat": True}),
    )


@dataclass
class LeakScanner:
    """Secrets by the conversation key they were said in, and the request
    bodies of each event by the place the event happened in."""

    origins: dict[str, str] = field(default_factory=dict)  # value -> place key
    checked: list[tuple[Place, list[dict[str, Any]]]] = field(default_factory=list)

    def secret(self, place: Place, value: str = "") -> str:
        value = value or new_value()
        self.origins[value] = place.key
        return value

    def record(self, place: Place, bodies: list[dict[str, Any]]) -> None:
        self.checked.append((place, bodies))

    def leaks_in(self, place: Place, body: dict[str, Any]) -> list[str]:
        visible = Visibility.of(place)
        text = json.dumps(body, ensure_ascii=False)
        return sorted(value for value, key in self.origins.items() if not visible.sees(key) and value in text)

    def leaking_requests(self) -> list[tuple[str, list[str]]]:
        """(place key, leaked values) of every request that held a value its place may not see."""
        found = []
        for place, bodies in self.checked:
            for body in bodies:
                leaked = self.leaks_in(place, body)
                if leaked:
                    found.append((place.key, leaked))
        return found

    def requests_made(self) -> int:
        return sum(len(bodies) for _, bodies in self.checked)
