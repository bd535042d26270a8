"""The LLM client: any OpenAI-compatible chat-completions endpoint.

Retries with exponential backoff on 429, 5xx, timeouts and dropped connections
are the `openai` client's own (it honours Retry-After); this module adds one
error type with a message a person can act on, and reads the answer defensively:
whatever the server sends, the agent gets a `Completion` of plain strings or an
`LLMUnavailableError`, never another exception.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from bot import metrics
from bot.sanitize import fix_surrogates

log = logging.getLogger(__name__)


# Every note the person gets says: what is wrong, that their message is kept, and
# that they can try again (tests/test_llm_fault_property.py checks all three).
SAVED = "Your message is saved; please try again"


def trouble(what: str, when: str = "shortly") -> str:
    return f"I'm having trouble: {what}. {SAVED} {when}."


class LLMUnavailableError(Exception):
    """The model could not be reached or answered garbage, after retries."""

    def __init__(self, reason: str, user_message: str) -> None:
        super().__init__(reason)
        self.user_message = user_message


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class Completion:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    # Prompt tokens the server says it served from its prompt cache
    # (`usage.prompt_tokens_details.cached_tokens`: OpenAI, vLLM); 0 if it does not say.
    cached_tokens: int = 0


@dataclass(slots=True)
class TokenUsage:
    """Tokens of LLM calls: the prompt and completion counted locally, and how
    many of the prompt's tokens the server said it had cached."""

    prompt: int = 0
    cached: int = 0
    completion: int = 0

    def add(self, other: TokenUsage) -> None:
        self.prompt += other.prompt
        self.cached += other.cached
        self.completion += other.completion

    def since(self, earlier: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.prompt - earlier.prompt, self.cached - earlier.cached, self.completion - earlier.completion
        )

    def copy(self) -> TokenUsage:
        return TokenUsage(self.prompt, self.cached, self.completion)


class LLMClient:
    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
    ) -> None:
        self.model = model
        self._api_key = api_key
        request_timeout = openai.Timeout(timeout, connect=min(timeout, 10.0))
        self.client = openai.AsyncOpenAI(
            api_key=api_key or "not-set",
            base_url=base_url,
            timeout=request_timeout,
            max_retries=max_retries,
            # The default httpx transport, not the SDK's aiohttp option: that one
            # reports a refused connection as a timeout, which misleads the user.
        )

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        model: str | None = None,
        call_functions: bool = True,
    ) -> Completion:
        """One chat completion; `model` overrides the client's (a cheaper summarizer)."""
        started = time.perf_counter()
        try:
            completion = await self._complete(messages, tools, model or self.model, call_functions)
            metrics.record_llm_call(time.perf_counter() - started, ok=True)
            return completion
        except LLMUnavailableError as error:
            metrics.record_llm_call(time.perf_counter() - started, ok=False)
            # Some OpenAI-compatible servers and proxies quote the key they refused
            # in the error body, which our error text (logged) carries along.
            reason = str(error)
            if len(self._api_key) < 8 or self._api_key not in reason:
                raise
            # `from None`: the SDK's own exception in the chain holds the key too.
            raise LLMUnavailableError(reason.replace(self._api_key, "***"), error.user_message) from None

    async def _complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, model: str, call_functions: bool
    ) -> Completion:
        kwargs: dict[str, Any] = {"model": model, "messages": messages}
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = "auto" if call_functions else "none"
        try:
            # The low-level post keeps the client's retries, auth and error types but
            # skips its typed-params transform, which walks every message of the
            # request in Python and cost ~10 ms per call on a full context. Our
            # messages are already plain API-shaped dicts.
            response = await self.client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion)
        except openai.AuthenticationError as error:
            raise LLMUnavailableError(
                f"authentication failed: {error}",
                trouble("my language model refused my API key (an admin needs to check OPENAI_API_KEY)", "later"),
            ) from error
        except openai.NotFoundError as error:
            raise LLMUnavailableError(
                f"model or endpoint not found: {error}",
                trouble(f"my language model server does not know the model '{model}'", "later"),
            ) from error
        except openai.RateLimitError as error:
            raise LLMUnavailableError(
                f"rate limited after retries: {error}",
                trouble("my language model is rate-limiting me", "in a minute"),
            ) from error
        except openai.APITimeoutError as error:
            raise LLMUnavailableError(
                "timed out after retries",
                trouble("my language model is not answering in time"),
            ) from error
        except openai.APIConnectionError as error:
            raise LLMUnavailableError(
                f"connection failed after retries: {error}",
                trouble("I can't connect to my language model right now"),
            ) from error
        except (openai.APIError, json.JSONDecodeError, ValueError) as error:
            # APIStatusError (5xx and other statuses) and bodies that are not JSON.
            raise LLMUnavailableError(
                f"bad answer from the LLM server: {type(error).__name__}: {error}",
                trouble("my language model answered with an error"),
            ) from error
        completion = _parse(response)
        # Counted once parsed: a body that does not parse is counted by complete() as an error.
        metrics.record_tokens(getattr(response, "usage", None))
        return completion

    async def close(self) -> None:
        await self.client.close()


def _parse(response: Any) -> Completion:
    """The first choice's message, as plain strings. The client does not validate a 200
    body: an HTML page arrives as a str, `{}` as a ChatCompletion with `choices=None`, and
    fields can hold any JSON type. A body with no message is an error; odd fields are
    coerced, so the agent's functions see strings and report bad calls to the model."""
    choices = _field(response, "choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = _field(choice, "message")
    if message is None or isinstance(message, str | int | float | list):
        error = _field(response, "error")
        detail = f"an error with status 200: {error!r:.200}" if error else f"no message in {response!r:.200}"
        raise LLMUnavailableError(
            f"unreadable answer from the LLM server: {detail}",
            trouble("my language model sent an answer I can't read"),
        )
    raw_calls = _field(message, "tool_calls")
    calls = []
    for index, call in enumerate(raw_calls if isinstance(raw_calls, list) else []):
        function = _field(call, "function")
        if function is None or isinstance(function, str | int | float | list):
            continue  # not a function call (an unknown call type, or garbage): nothing to run
        call_id = _field(call, "id")
        calls.append(
            ToolCall(
                id=_text(call_id) if call_id not in (None, "") else f"call_{index}",
                name=fix_surrogates(_text(_field(function, "name"))),
                arguments=fix_surrogates(_text(_field(function, "arguments"))),
            )
        )
    content = _field(message, "content")
    # Model output is stored as is: a lone surrogate would make it unstorable.
    text = None if content is None else fix_surrogates(_content_text(content))
    return Completion(content=text, tool_calls=calls, cached_tokens=_cached_tokens(response))


def _cached_tokens(response: Any) -> int:
    """`usage.prompt_tokens_details.cached_tokens`, if the server sent a
    sensible one (OpenAI and vLLM do; most others send no details): else 0."""
    details = _field(_field(response, "usage"), "prompt_tokens_details")
    cached = _field(details, "cached_tokens")
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached > 0 else 0


def _field(obj: Any, name: str) -> Any:
    """`obj.name` of a parsed model, or `obj[name]` of a raw dict the client left
    unconverted because it did not match the expected type; None if absent."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _text(value: Any) -> str:
    """A string field (id, name, arguments) as a string. Some servers send the arguments
    as a JSON object instead of a JSON string: encode it back rather than fail the call."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _content_text(content: Any) -> str:
    """Content as text; a list of content parts (`[{"type": "text", "text": ...}]`)
    is joined, anything else stringified."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [_field(part, "text") if not isinstance(part, str) else part for part in content]
        return "".join(part for part in parts if isinstance(part, str))
    return _text(content)
