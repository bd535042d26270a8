"""The request body the bot encodes itself (bot/llm/shape.py) is the one the
openai client would have sent, byte for byte, and follows its schemas' changes."""

from __future__ import annotations

from typing import Any

from openai._utils._json import openapi_dumps

from bot.functions.core import build_core_functions
from bot.llm.shape import RequestEncoder


def test_bodies_are_the_clients_own_bytes_and_schemas_are_encoded_once() -> None:
    schemas = build_core_functions().schemas
    encoder = RequestEncoder()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": 'Ünïcode, "quotes", back\\slash and\nnew lines'},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {}}]},
    ]
    bodies: list[dict[str, Any]] = [
        {"model": "m", "messages": messages, "tools": schemas, "tool_choice": "auto", "max_tokens": 512},
        {"model": "m", "messages": messages, "tools": schemas, "tool_choice": "none"},
        {"model": "m", "messages": messages, "max_completion_tokens": 9},
        {"model": "m", "messages": [], "tools": []},
    ]
    for body in bodies * 2:  # the second time from the memo
        assert encoder.encode(body) == openapi_dumps(body)
    # A function registered after the schemas were first sent goes out too.
    schemas.append({"type": "function", "function": {"name": "late_addition", "parameters": {"type": "object"}}})
    assert encoder.encode(bodies[0]) == openapi_dumps(bodies[0])
    assert b"late_addition" in encoder.encode(bodies[0])
    # Another list with the same content is another entry, not a stale one.
    other = [dict(schema) for schema in schemas[:2]]
    assert encoder.encode(dict(bodies[0], tools=other)) == openapi_dumps(dict(bodies[0], tools=other))
