"""The LLM client: any OpenAI-compatible chat-completions endpoint.

Retries with exponential backoff on 429, 5xx, timeouts and dropped connections
are the `openai` client's own (it honours Retry-After); this module adds one
error type with a message a person can act on.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletion

log = logging.getLogger(__name__)


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
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> Completion:
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = "auto"
        try:
            # The low-level post keeps the client's retries, auth and error types but
            # skips its typed-params transform, which walks every message of the
            # request in Python and cost ~10 ms per call on a full context. Our
            # messages are already plain API-shaped dicts.
            response = await self.client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion)
        except openai.AuthenticationError as error:
            raise LLMUnavailableError(
                f"authentication failed: {error}",
                "I can't reach my language model: the API key was refused. An admin needs to check OPENAI_API_KEY.",
            ) from error
        except openai.NotFoundError as error:
            raise LLMUnavailableError(
                f"model or endpoint not found: {error}",
                f"I can't reach my language model: the server does not know model '{self.model}'.",
            ) from error
        except openai.RateLimitError as error:
            raise LLMUnavailableError(
                f"rate limited after retries: {error}",
                "I'm having trouble: my language model is rate-limiting me. Your message is saved; "
                "please try again in a minute.",
            ) from error
        except openai.APITimeoutError as error:
            raise LLMUnavailableError(
                "timed out after retries",
                "I'm having trouble: my language model is not answering in time. Your message is saved; "
                "please try again shortly.",
            ) from error
        except openai.APIConnectionError as error:
            raise LLMUnavailableError(
                f"connection failed after retries: {error}",
                "I'm having trouble: I can't connect to my language model right now. Your message is saved; "
                "please try again shortly.",
            ) from error
        except (openai.APIError, json.JSONDecodeError, ValueError) as error:
            # APIStatusError (5xx and other statuses) and bodies that are not JSON.
            raise LLMUnavailableError(
                f"bad answer from the LLM server: {type(error).__name__}: {error}",
                "I'm having trouble: my language model answered with an error. Your message is saved; "
                "please try again shortly.",
            ) from error
        return _parse(response)

    async def close(self) -> None:
        await self.client.close()


def _parse(response: Any) -> Completion:
    try:
        message = response.choices[0].message
    except (AttributeError, IndexError, TypeError) as error:
        raise LLMUnavailableError(
            f"response without choices: {response!r:.200}",
            "I'm having trouble: my language model sent an empty answer. Please try again.",
        ) from error
    calls = []
    for index, call in enumerate(message.tool_calls or []):
        function = getattr(call, "function", None)
        if function is None:
            continue
        calls.append(
            ToolCall(
                id=call.id or f"call_{index}",
                name=function.name or "",
                arguments=function.arguments if function.arguments is not None else "",
            )
        )
    return Completion(content=message.content, tool_calls=calls)
