"""The crash harness's scripted model (tests/crash_harness.py): a redone step
gets the same answer, decided by the request alone (with debounce on, and by
which messages it named before: BatchModel).

Each user sends numbered messages ("msg U3 17"); the model answers "re: U3 17"
with send_message, and for every fourth message first saves a fact "[U3:16]"
to working context (a two-step chain, so kills also land between steps). With
debounce on, quick messages arrive as one event: then every message since the
last answer is answered at once ("re: U3 15 16 17"), each due fact saved first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tests.fake_llm import Reply, is_summary_request, reply_text, reply_tool_calls, tool_call
from tests.helpers import text_of

MESSAGE = re.compile(r"msg (U\d+) (\d+)$")
FACT = re.compile(r"\[(U\d+):(\d+)\]")
ANSWER = re.compile(r"re: (U\d+)((?: \d+)+)")


def saved(fact: str, messages: list[dict[str, Any]]) -> bool:
    """Whether the working context holds `fact` as the model sees it: in the system
    message, or saved by a call in the queue whose result said it went through
    (an edit shows in the system message from the next cut of the queue on)."""
    if fact in str(messages[0]["content"]):
        return True
    results = {m.get("tool_call_id"): str(m.get("content")) for m in messages if m["role"] == "tool"}
    return any(
        call["function"]["name"] == "core_memory_append"
        and fact in call["function"]["arguments"]
        and '"OK"' in results.get(call["id"], "")
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    )


def scripted_model(
    request: dict[str, Any], poison: Callable[[str, int], None] | None = None, *, batches: BatchModel | None = None
) -> Reply:
    """The answer to one request. `poison(user, number)` is called first with
    the message asked about: the harness kills the bot there when that message
    is its poison event. `batches`: debounce is on (BatchModel answers)."""
    messages = request["messages"]
    if is_summary_request(request):
        return reply_text("Earlier: numbered test messages.")
    if batches is not None:
        return batches(messages)
    asked = None
    for message in reversed(messages):
        if message["role"] == "user":
            found = MESSAGE.search(text_of(message))
            if found:
                asked = found.group(1), int(found.group(2))
                break
    if asked is None:
        return reply_text("nothing to do")
    user, number = asked
    if poison is not None:
        poison(user, number)
    last = messages[-1]
    fact = f"[{user}:{number}]"
    # A save cut short by a kill comes back as "may or may not have taken
    # effect": like a careful model, look at the working context (the system
    # message, and this queue's saves not shown there yet) and save again only
    # if the fact is not there.
    cut_short = last["role"] == "tool" and "Cut short by a restart" in str(last.get("content"))
    if number % 4 == 0 and (last["role"] == "user" or cut_short) and not saved(fact, messages):
        return reply_tool_calls(
            tool_call("core_memory_append", {"name": "human", "content": fact, "request_heartbeat": True})
        )
    return reply_tool_calls(tool_call("send_message", {"message": f"re: {user} {number}"}))


class BatchModel:
    """With debounce on, every message since the last answer is asked about:
    each due fact is saved first (one a step; once saved it shows in the
    working context), then one answer names them all.

    One thing it remembers, as a model with a memory of its own answers would:
    which messages it has named. A reply that reached the outbox just before a
    kill is sent again from there without its step, so that step never enters
    the queue, and the next request shows those messages unanswered; they are
    not named again. A redone request (the same messages) gets the same answer."""

    def __init__(self, delivered: Callable[[str, int], bool] | None = None) -> None:
        self._named: dict[tuple[str, int], tuple[int, ...]] = {}  # message -> the messages asked with it
        # With several processes (tests/multiproc_harness.py) a newer event can
        # run before a killed process's older one is taken over: it then shows
        # the older messages, which a run killed before its answer reached the
        # outbox had named. `delivered(user, n)`: whether an answer naming that
        # message reached the outbox; one that did not is named again.
        self._delivered = delivered

    def __call__(self, messages: list[dict[str, Any]]) -> Reply:
        asked: list[int] = []
        user = ""
        for message in reversed(messages):
            if message["role"] == "assistant" and "send_message" in json.dumps(message.get("tool_calls") or []):
                break
            found = MESSAGE.search(text_of(message)) if message["role"] == "user" else None
            if found:
                user = found.group(1)
                asked.insert(0, int(found.group(2)))
        together = tuple(asked)
        todo = [n for n in asked if self._takes((user, n), together)]
        if not todo:
            return reply_text("nothing to do")
        for number in todo:
            fact = f"[{user}:{number}]"
            if number % 4 == 0 and not saved(fact, messages):
                return reply_tool_calls(
                    tool_call("core_memory_append", {"name": "human", "content": fact, "request_heartbeat": True})
                )
        return reply_tool_calls(tool_call("send_message", {"message": f"re: {user} {' '.join(map(str, todo))}"}))

    def _takes(self, message: tuple[str, int], together: tuple[int, ...]) -> bool:
        if self._named.setdefault(message, together) == together:
            return True
        if self._delivered is not None and not self._delivered(*message):
            self._named[message] = together
            return True
        return False


def answered_in(text: str) -> list[tuple[str, int]]:
    """The messages a post answers ("re: U3 15 16" answers two)."""
    found = ANSWER.fullmatch(text)
    return [(found.group(1), int(number)) for number in found.group(2).split()] if found else []
