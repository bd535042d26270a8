"""Requests every common OpenAI-compatible server accepts, and their repairs.

OpenAI accepts some shapes that other servers refuse: llama-cpp-python's
pydantic schema refuses an assistant message whose `content` is null beside
`tool_calls`; vLLM's Mistral templates want tool-call ids of a fixed
alphabet; many chat templates (llama.cpp's Jinja ones) refuse roles that do
not alternate, or a tool message at all. `portable` gives every request the
shape they all accept, message by message (so a request still starts with the
previous request's messages exactly: providers' prompt caches keep working).

When a server refuses a request anyway, `repair` makes a more conservative
version, level by level (bot/llm/client.py tries them in order and remembers
what worked per endpoint). Only what is sent changes: the queue and recall
storage keep every message as it was.

The body goes as JSON bytes encoded here (RequestEncoder): the function schemas
are about half of an ordinary request and the same in every request the agents
make, yet the costliest part to encode (many small nested objects), so each
list of schemas is encoded once and its bytes spliced into every body that
carries it. The bytes are those the openai client would send for the same body.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

# OpenAI allows up to 40 characters; Mistral's templates in vLLM want [a-zA-Z0-9]{9}.
# Ids outside the common alphabet are rewritten to one every server takes.
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,40}$")

# Repair levels, mildest first.
DROP_NAMED = 1  # drop the messages the refusal names (by index), and their call/result partners
TOOLS_AS_TEXT = 2  # function calls and results as plain text, consecutive roles merged
NEWEST_ONLY = 3  # the system message and the newest message only
LEVELS = (DROP_NAMED, TOOLS_AS_TEXT, NEWEST_ONLY)
LEVEL_NAMES = {
    DROP_NAMED: "dropped the messages the server named",
    TOOLS_AS_TEXT: "sent function calls and results as plain text",
    NEWEST_ONLY: "sent only the instructions and the newest message",
}

# "messages.3.content", "messages[3]", "('body', 'messages', 3, ...)", "messages -> 3"
_MESSAGE_INDEX = re.compile(r"messages['\"]?\s*(?:[.\[,/]|->)\s*(\d+)")


def portable_id(call_id: Any) -> str:
    """A tool-call id every server accepts; the same id always maps to the same one."""
    text = "" if call_id is None else str(call_id)
    if _SAFE_ID.match(text):
        return text
    return "call" + hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def portable_message(message: dict[str, Any]) -> dict[str, Any]:
    """`message` in the shape every server accepts; the same dict when it has it already
    (most messages: the check is cheap, and nothing is copied)."""
    content = message.get("content")
    calls = message.get("tool_calls")
    role = message.get("role")
    needs = not isinstance(content, str)
    if calls:
        needs = needs or any(not _portable_call(call) for call in calls)
    if role == "tool":
        needs = needs or not isinstance(message.get("tool_call_id"), str) or not _SAFE_ID.match(message["tool_call_id"])
    if not needs:
        return message
    fixed = dict(message)
    fixed["content"] = _as_text(content)
    if calls:
        fixed["tool_calls"] = [_fixed_call(call, index) for index, call in enumerate(calls)]
    if role == "tool":
        fixed["tool_call_id"] = portable_id(message.get("tool_call_id"))
    return fixed


def portable(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [portable_message(message) for message in messages]


def _portable_call(call: Any) -> bool:
    if not isinstance(call, dict) or call.get("type") != "function":
        return False
    function = call.get("function")
    return (
        isinstance(call.get("id"), str)
        and bool(_SAFE_ID.match(call["id"]))
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), str)
    )


def _fixed_call(call: Any, index: int) -> dict[str, Any]:
    call = call if isinstance(call, dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    arguments = function.get("arguments")
    return {
        "id": portable_id(call.get("id") if call.get("id") not in (None, "") else f"call_{index}"),
        "type": "function",
        "function": {
            "name": _as_text(function.get("name")),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}, ensure_ascii=False),
        },
    }


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in value)
    return json.dumps(value, ensure_ascii=False)


# -- repairs ---------------------------------------------------------------------
def named_indexes(refusal: str) -> set[int]:
    """The message indexes a refusal names (pydantic's `loc`, "messages[3]")."""
    return {int(match) for match in _MESSAGE_INDEX.findall(refusal)}


def fingerprint(message: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(message, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def drop_messages(messages: Sequence[dict[str, Any]], drop: Iterable[int]) -> list[dict[str, Any]]:
    """Without the messages at `drop` (never the system message or the newest),
    and without what they leave broken: a call's results go with the call, and
    a call goes with its results (no server accepts a call without its answer)."""
    dropped = {index for index in drop if 0 < index < len(messages) - 1}
    ids: set[str] = set()
    for index in dropped:
        message = messages[index]
        ids.update(str(call.get("id")) for call in message.get("tool_calls") or [])
        if message.get("role") == "tool":
            ids.add(str(message.get("tool_call_id")))
    kept = []
    last = len(messages) - 1
    for index, message in enumerate(messages):
        calls = {str(call.get("id")) for call in message.get("tool_calls") or []}
        partner = message.get("role") == "tool" and str(message.get("tool_call_id")) in ids
        if index == last and (partner or calls & ids):
            kept += tools_as_text([message])  # the newest always goes: as text if its partner went
        elif not (index in dropped or partner or calls & ids):
            kept.append(message)
    return kept


def tools_as_text(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function calls and results rewritten as plain assistant and user text, and
    consecutive messages of one role merged: what any chat template renders."""
    plain: list[dict[str, Any]] = []
    for message in messages:
        role, content = message.get("role"), _as_text(message.get("content"))
        if message.get("tool_calls"):
            calls = "; ".join(
                f"{call['function']['name']}({call['function']['arguments']})" for call in message["tool_calls"]
            )
            content = f"{content}\n[I called {calls}]".strip()
            role = "assistant"
        elif role == "tool":
            role, content = "user", f"[function result] {content}"
        if plain and plain[-1]["role"] == role and role != "system":
            plain[-1] = {"role": role, "content": f"{plain[-1]['content']}\n\n{content}"}
        else:
            plain.append({"role": role, "content": content})
    if len(plain) > 1 and plain[1]["role"] == "assistant":
        # Templates that want the conversation to start with the person.
        plain.insert(1, {"role": "user", "content": "(earlier conversation)"})
    return plain


def newest_only(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    system = [m for m in messages[:1] if m.get("role") == "system"]
    newest = tools_as_text(messages[-1:]) if messages else []
    if newest and newest[0]["role"] != "user":
        newest = [{"role": "user", "content": newest[0]["content"]}]
    return [*system, *newest]


def repair(messages: Sequence[dict[str, Any]], level: int, refusal: str) -> list[dict[str, Any]] | None:
    """The request at repair `level`, or None when that level changes nothing."""
    if level == DROP_NAMED:
        named = named_indexes(refusal)
        repaired = drop_messages(messages, named) if named else None
    elif level == TOOLS_AS_TEXT:
        repaired = tools_as_text(messages)
    else:
        repaired = newest_only(messages)
    return repaired if repaired is not None and repaired != list(messages) else None


# The openai client's own JSON settings (openai/_utils/_json.py), which are httpx's.
_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)

# Distinct schema lists a process sends are few (one per function set); a bound
# keeps a caller that builds a new list per request from growing the memo.
_MEMO_LIMIT = 16


class RequestEncoder:
    def __init__(self) -> None:
        # id(schemas) -> (the list itself, its length when encoded, its JSON). The
        # list is held, so its id cannot be reused by another while it is here.
        self._schemas: dict[int, tuple[list[dict[str, Any]], int, str]] = {}

    def encode(self, body: dict[str, Any]) -> bytes:
        tools = body.get("tools")
        if not isinstance(tools, list):
            return _encoder.encode(body).encode()
        parts = []
        for key, value in body.items():
            text = self._schemas_json(tools) if key == "tools" else _encoder.encode(value)
            parts.append(f"{_encoder.encode(key)}:{text}")
        return ("{" + ",".join(parts) + "}").encode()

    def _schemas_json(self, schemas: list[dict[str, Any]]) -> str:
        known = self._schemas.get(id(schemas))
        if known is not None and known[0] is schemas and known[1] == len(schemas):
            return known[2]
        text = _encoder.encode(schemas)
        if len(self._schemas) >= _MEMO_LIMIT:
            self._schemas.clear()
        self._schemas[id(schemas)] = (schemas, len(schemas), text)
        return text
