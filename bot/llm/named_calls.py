"""A step's function call asked for by name, where the server cannot stream the call
its model chose, or left the model no words for an answer.

llama-cpp-python 0.3.36's `chatml-function-calling` (llama_cpp/llama_chat_format.py)
answers tool_choice "auto" in two moves: a grammar-constrained choice between
"message:" and "functions.NAME:" (never streamed), then the answer:

- a function: streamed, it raises ("Automatic streaming tool choice is not
  supported") and the stream ends without an event of the call; not streamed, it
  writes the arguments with no max_tokens (a small model rambling in a string runs
  to the end of the context), then chooses again after them;
- a message: written under the grammar of that second choice, which allows only
  the end or another "functions.NAME:", so the words are "" (or that name), and
  its stream carries no usage (it ignores stream_options).

A named tool_choice takes another path there: the same prompt (its prompt cache
serves it) plus "functions.NAME:", the arguments streamed under the schema's
grammar, stopped at max_tokens. So the client (bot/llm/client.py: RequestRun)
asks for the call by name once it knows the name:

- the stream broke off (the model chose a function): the same request, not
  streamed, with stop strings that end the arguments at their first "{" and the
  choice after them at "functions" (the handler passes the request's `stop` to
  those two and to nothing else), names it in a few tokens;
- an answer without words and without usage (the message grammar above): the
  function it wrote the name of, or else the answer function (the model chose to
  answer, and the agent's answer is that function's call).

Once such a call came back, the endpoint knows it streams named calls
(`Endpoint.names_calls`): from then on a step's choice skips the streamed request
that cannot carry it (seconds of generation for nothing, on every step) and is asked
for unstreamed, by name, at once; and a failed chain's last request there is the step's own,
the answer function named (bot/agent_calls.py: plain_answer), which its prompt
cache serves, where a request without the functions renders another prompt after
the system text and has the whole of it evaluated again.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from bot.llm.types import Completion, Request

NAME_ONLY_STOPS = ["{", "functions"]
WRITTEN_NAME = re.compile(r"^\s*functions\.([A-Za-z0-9_.-]+):?\s*$")


class Learner(Protocol):
    """What the endpoint learns here (bot/llm/client.py: Endpoint)."""

    names_calls: bool

    def tell_once(self, key: str, text: str) -> None: ...


def choice(name: str) -> dict[str, Any]:
    """The tool_choice that names function `name`."""
    return {"type": "function", "function": {"name": name}}


def asks_a_choice(body: dict[str, Any]) -> bool:
    """A streamed step that leaves the choice of function to the model."""
    return bool(body.get("tools")) and body.get("tool_choice") == "auto" and "stream" in body


def left_no_words(body: dict[str, Any], completion: Completion) -> bool:
    """An answer to `body` with no call, no words (or a function's name as its words), and no usage."""
    text = (completion.content or "").strip()
    return (
        asks_a_choice(body)
        and not completion.tool_calls
        and not completion.usage.prompt
        and (not text or WRITTEN_NAME.match(text) is not None)
    )


def name_only(body: dict[str, Any]) -> dict[str, Any]:
    """`body` not streamed, answered with the chosen function's name and no arguments."""
    plain = {key: value for key, value in body.items() if key not in ("stream", "stream_options")}
    return {**plain, "stop": NAME_ONLY_STOPS}


def named(body: dict[str, Any], name: str) -> dict[str, Any]:
    return {**body, "tool_choice": choice(name)}


def wanted(body: dict[str, Any], completion: Completion, answer_function: str) -> str | None:
    """The offered function `completion` chose or named, else the answer function; None when not offered."""
    text = (completion.content or "").strip()
    written = WRITTEN_NAME.match(text)
    if completion.tool_calls:
        name = completion.tool_calls[0].name
    elif written is not None:
        name = written.group(1)
    else:
        name = "" if text else answer_function
    offered = {tool.get("function", {}).get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)}
    return name if name and name in offered else None


async def by_name(
    answer: Callable[[dict[str, Any]], Awaitable[Completion]],
    body: dict[str, Any],
    completion: Completion | None,
    request: Request,
    endpoint: Learner,
) -> Completion:
    """The step's call asked for by name, streamed; the name from `completion`, or (None:
    the stream broke off) from `body` not streamed, cut after the name. `completion` (or
    that answer) when it names no function offered, or the named request brings no call."""
    if completion is None:
        completion = await answer(name_only(body))
    name = wanted(body, completion, request.answer_function)
    if name is None:
        return completion
    note = "the LLM server left a step's call out of its stream (or its words out): asked by name"
    endpoint.tell_once("by name", note)
    called = await answer(named(body, name))
    if not called.usage.prompt:
        called.usage = completion.usage  # the name's answer counted the prompt, where a stream did not
    endpoint.names_calls = endpoint.names_calls or name in {call.name for call in called.tool_calls}
    return called if called.tool_calls else completion
