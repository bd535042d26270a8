"""What a server's error means: a refusal of the request (`classify`, from its
status and its words), which the client may repair, or an outage or a refusal
past repair, an `LLMUnavailableError` with a note a person can act on
(`unavailable`, `unrepaired`).

Each server words a refusal its own way; these are the ones seen in the wild:

- the prompt is over the context limit:
  - OpenAI, vLLM, llama-cpp-python: "This model's maximum context length is 2560
    tokens. However, you requested 2723 tokens (2211 in the messages, 512 in the
    completion)" (OpenAI: "your messages resulted in N tokens"); newer vLLM: "...
    is 2048 tokens and your request has 1600 input tokens";
  - llama.cpp's llama-server: "request (4476 tokens) exceeds the available context
    size (4096 tokens)" with `n_prompt_tokens` and `n_ctx` in the error object
    (type `exceed_context_size_error`); older ones: "the request exceeds the
    available context size";
  - llama-cpp-python's own words under its OpenAI-style ones: "Requested tokens
    (2723) exceed context window of 2560";
  - others: "context_length_exceeded", "prompt is too long", "input is too long";
- a parameter the server does not take: "Unsupported parameter: 'max_tokens' ...
  Use 'max_completion_tokens' instead" (OpenAI's reasoning models), "Unrecognized
  request argument supplied: tool_choice", pydantic's "Extra inputs are not
  permitted" at `('body', 'parallel_tool_calls')`, vLLM's "\"auto\" tool choice
  requires --enable-auto-tool-choice"; tools themselves: llama-server's "tools param
  requires --jinja flag", Ollama's "model does not support tools" (then the model
  answers in plain text, which is sent as its answer);
- the request's shape: any other 400 or 422, and a 500 whose words are a
  validation's (llama-cpp-python answers its schema's "7 validation errors" with
  500; llama.cpp's chat templates raise "Conversation roles must alternate").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai

from bot.llm.types import LATE, LLMUnavailableError, trouble

# Parameters the bot sends that a request can do without (`stream_options` before
# `stream`, whose name it contains).
OPTIONAL_PARAMETERS = (
    "max_tokens",
    "max_completion_tokens",
    "tool_choice",
    "parallel_tool_calls",
    "stream_options",
    "stream",
)
# (`tools` too, by its own words below: "tools" alone is in too many refusals.)
# Streaming named as refused: quoted, or "stream=true" / "streaming ... not supported"
# (the bare word may be in a refused message's own text, which pydantic quotes back).
_STREAM_REFUSED = re.compile(
    r"['\"]stream['\"]|stream\s*=\s*true|streaming[^.]{0,40}(?:not supported|unsupported|not allowed)", re.IGNORECASE
)

_CONTEXT_WORDS = re.compile(
    r"maximum context length|context length|context size|context window|context_length_exceeded|"
    r"exceed_context_size|prompt is too long|input is too long|too many tokens|exceeds? (?:the )?(?:maximum|max)",
    re.IGNORECASE,
)
_LIMIT = [
    re.compile(r"maximum context length is (\d+)", re.IGNORECASE),
    re.compile(r"available context size \((\d+)", re.IGNORECASE),
    re.compile(r"context (?:length|size|window) (?:of|is) (\d+)", re.IGNORECASE),
    re.compile(r"exceeds limit of (\d+)", re.IGNORECASE),
    re.compile(r"exceed context window of (\d+)", re.IGNORECASE),
]
_PROMPT = [
    re.compile(r"\((\d+) in the messages", re.IGNORECASE),
    re.compile(r"messages resulted in (\d+) tokens", re.IGNORECASE),
    re.compile(r"request has (\d+) input tokens", re.IGNORECASE),
    re.compile(r"request \((\d+) tokens\)", re.IGNORECASE),
    re.compile(r"prompt \((\d+) tokens\)", re.IGNORECASE),
    re.compile(r"requested tokens \((\d+)\)", re.IGNORECASE),
]
_VALIDATION_WORDS = re.compile(
    r"validation error|input should be|field required|extra inputs|not permitted|invalid|must be|"
    r"expected|unsupported|unrecognized|roles must alternate|template|jinja|cannot be null|none is not",
    re.IGNORECASE,
)


@dataclass(slots=True)
class Refusal:
    """A server's deliberate no to a request (not an outage)."""

    status: int
    text: str
    context_limit: int | None = None  # the server's window, when it said
    server_prompt_tokens: int | None = None  # its count of our prompt, when it said
    over_context: bool = False
    parameter: str | None = None  # an optional parameter it refused


def error_text(error: openai.APIStatusError) -> str:
    """The refusal's words: the error object's message and the rest of its body."""
    body = error.body
    parts = [str(error.message or "")]
    if isinstance(body, dict):
        inner = body.get("error", body)
        parts.append(str(inner.get("message", "")) if isinstance(inner, dict) else str(inner))
        parts.append(str(body.get("detail", "")))
    elif body is not None:
        parts.append(str(body))
    return " ".join(part for part in parts if part)[:4000]


def classify(error: openai.APIStatusError, sent: dict[str, Any]) -> Refusal | None:
    """The refusal `error` is, or None for an outage (401/403/404/408/409/429,
    and 5xx that do not speak of the request)."""
    status = error.status_code
    text = error_text(error)
    if status in (401, 403, 404, 408, 409, 429):
        return None
    refusal = Refusal(status, text)
    if _CONTEXT_WORDS.search(text):
        details = _error_object(error)
        refusal.over_context = True
        refusal.context_limit = _int(details.get("n_ctx")) or _first(_LIMIT, text)
        refusal.server_prompt_tokens = _int(details.get("n_prompt_tokens")) or _first(_PROMPT, text)
        return refusal
    lowered = text.lower()
    for name in OPTIONAL_PARAMETERS:
        if name == "stream":
            if name in sent and _STREAM_REFUSED.search(text):
                refusal.parameter = name
                return refusal
            continue
        if name in sent and (f"'{name}'" in lowered or f'"{name}"' in lowered or f" {name}" in lowered):
            if name == "max_tokens" and "max_completion_tokens" in lowered and "max_completion_tokens" not in sent:
                refusal.parameter = name  # "use max_completion_tokens instead"
                return refusal
            if name != "max_tokens" or "unsupported" in lowered or "unrecognized" in lowered or "extra" in lowered:
                refusal.parameter = name
                return refusal
    if "auto" in lowered and "tool choice" in lowered and "tool_choice" in sent:
        refusal.parameter = "tool_choice"
        return refusal
    if "tools" in sent and ("--jinja" in lowered or "tools param" in lowered or "does not support tools" in lowered):
        refusal.parameter = "tools"  # llama-server without --jinja; Ollama models without tool support
        return refusal
    if status >= 500 and not _VALIDATION_WORDS.search(text):
        return None
    return refusal


def _error_object(error: openai.APIStatusError) -> dict[str, Any]:
    body = error.body
    inner = body.get("error", body) if isinstance(body, dict) else None
    return inner if isinstance(inner, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _first(patterns: list[re.Pattern[str]], text: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def refusal_summary(refusal: Refusal | None) -> str:
    return "" if refusal is None else f"HTTP {refusal.status}: {' '.join(refusal.text.split())[:200]}"


def unrepaired(refusal: Refusal) -> LLMUnavailableError:
    """A refusal no repair lifted."""
    return LLMUnavailableError(
        f"the LLM server refused the request, also repaired ({refusal_summary(refusal)})",
        trouble("my language model refused my request, even simplified (an admin can see why in the log)"),
    )


def unavailable(error: Exception, model: str) -> LLMUnavailableError:
    """The error a person can act on, for an exception of the `openai` client."""
    if isinstance(error, openai.AuthenticationError):
        return LLMUnavailableError(
            f"authentication failed: {error}",
            trouble("my language model refused my API key (an admin needs to check OPENAI_API_KEY)", "later"),
        )
    if isinstance(error, openai.NotFoundError):
        return LLMUnavailableError(
            f"model or endpoint not found: {error}",
            trouble(f"my language model server does not know the model '{model}'", "later"),
        )
    if isinstance(error, openai.RateLimitError):
        return LLMUnavailableError(
            f"rate limited after retries: {error}", trouble("my language model is rate-limiting me", "in a minute")
        )
    refused = _refused_connection(error)
    if isinstance(error, openai.APITimeoutError) and refused is None:
        return LLMUnavailableError("timed out after retries", trouble(LATE))
    if isinstance(error, openai.APIConnectionError):
        return LLMUnavailableError(
            f"connection failed after retries: {refused or error}",
            trouble("I can't connect to my language model right now"),
        )
    # APIStatusError (5xx and other statuses) and bodies that are not JSON.
    return LLMUnavailableError(
        f"bad answer from the LLM server: {type(error).__name__}: {error}",
        trouble("my language model answered with an error"),
    )


def _refused_connection(error: BaseException) -> BaseException | None:
    """The failed connection (refused, reset, closed by the server) behind a
    timeout the SDK's aiohttp transport reported: it maps every aiohttp
    connection error to a connect timeout. None for a real timeout."""
    cause = error.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, TimeoutError):
            return cause
        cause = cause.__cause__
    return None
