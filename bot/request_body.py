"""A chat-completions request body as the JSON bytes sent.

The function schemas are about half of an ordinary request and the same in
every request the agents make, yet they are the costliest part to encode (many
small nested objects): each list of schemas is encoded once and its bytes
spliced into every body that carries it. The bytes are those the openai client
would send for the same body (its encoder's settings), keys in the same order.
"""

from __future__ import annotations

import json
from typing import Any

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
