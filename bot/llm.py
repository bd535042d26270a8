"""The LLM client: any OpenAI-compatible chat-completions endpoint (OpenAI,
llama.cpp's servers, Ollama, vLLM).

Whatever the server does, the agent gets a `Completion` of plain strings
(bot/completion.py) or an `LLMUnavailableError` with a message a person can
act on, never another exception. How one request is shaped, sent and repaired
is bot/request_run.py; what the client learns about its endpoint (refused
parameters, the server's token ratio and context limit) is bot/endpoint.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai

from bot import metrics
from bot.completion import (
    SAVED,
    Completion,
    ContextLimitError,
    LLMUnavailableError,
    ToolCall,
    trouble,
)
from bot.endpoint import Endpoint, ModelLimits
from bot.request_run import RequestEncoder, RequestRun

log = logging.getLogger(__name__)


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
    """One OpenAI-compatible endpoint. Each request is shaped for every common
    server (bot/request_shape.py), carries a `max_tokens`, waits for a free slot
    when the endpoint's concurrency is capped, and is bounded in time: by the
    per-request timeout (MEMGPT_LLM_TIMEOUT) times the tries it may take, and
    by the caller's deadline (the message's time budget).

    A timed-out request is never re-sent: a server that answers one request at a
    time is still working on it, and a second copy would only queue behind the
    first. The request is given the time of its retries instead (one wait of
    timeout x (1 + retries)), then abandoned (its connection closed, which lets
    llama.cpp stop). Errors that mean the server did not take the request
    (refused connections, 429, 5xx outages) are retried by the `openai` client,
    which honours Retry-After. Refusals of the request itself are repaired
    (bot/refusals.py says what each means)."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        concurrency: int = 0,
    ) -> None:
        self.model = model
        self._api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.endpoint = Endpoint(concurrency=concurrency)
        self.encode = RequestEncoder().encode
        request_timeout = openai.Timeout(timeout, connect=min(timeout, 10.0))
        self.client = openai.AsyncOpenAI(
            api_key=api_key or "not-set",
            base_url=base_url,
            timeout=request_timeout,
            max_retries=max_retries,
            # The SDK's aiohttp transport, not its default httpx one: the httpx pool
            # checks every idle connection on every request (~0.8 of a CPU ms per
            # call at 64 concurrent requests, measured by bench/throughput.py), the
            # aiohttp one does not. It reports a refused connection as a timeout,
            # which `unavailable` sees through (the aiohttp error is the cause).
            http_client=openai.DefaultAioHttpClient(timeout=request_timeout),
        )

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        model: str | None = None,
        call_functions: bool = True,
        max_tokens: int = 0,
        deadline: float | None = None,
        prompt_tokens: int = 0,
    ) -> Completion:
        """One chat completion; `model` overrides the client's (a cheaper summarizer).
        `max_tokens`: the answer's cap (0: none sent); `deadline`: a time.monotonic()
        by which to give up; `prompt_tokens`: our count of the request, compared
        with the server's to learn its ratio (bot/endpoint.py)."""
        started = time.perf_counter()
        model = model or self.model
        try:
            completion = await self._bounded(messages, tools, model, call_functions, max_tokens, deadline)
            metrics.record_llm_call(time.perf_counter() - started, ok=True)
        except LLMUnavailableError as error:
            metrics.record_llm_call(time.perf_counter() - started, ok=False)
            if isinstance(error, ContextLimitError):
                self.endpoint.learn_context_limit(model, error.limit)
                if error.server_prompt_tokens and prompt_tokens:
                    self.endpoint.observe(model, error.server_prompt_tokens, prompt_tokens, refused=True)
            # Some OpenAI-compatible servers and proxies quote the key they refused
            # in the error body, which our error text (logged) carries along.
            reason = str(error)
            if len(self._api_key) < 8 or self._api_key not in reason:
                raise
            # `from None`: the SDK's own exception in the chain holds the key too.
            raise LLMUnavailableError(reason.replace(self._api_key, "***"), error.user_message) from None
        if prompt_tokens and completion.server_prompt_tokens and not completion.repaired:
            self.endpoint.observe(model, completion.server_prompt_tokens, prompt_tokens)
        return completion

    def limits(self, model: str | None = None) -> ModelLimits:
        """What the endpoint taught about `model`: its token ratio and context limit."""
        return self.endpoint.limits(model or self.model)

    async def _bounded(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        model: str,
        call_functions: bool,
        max_tokens: int,
        deadline: float | None,
    ) -> Completion:
        late = trouble("my language model is not answering in time")
        slots = self.endpoint.slots()
        if slots is None:
            return await self._timed(messages, tools, model, call_functions, max_tokens, deadline)
        # Waiting for a free slot is our queue, not the server's slowness: bounded by
        # the message's deadline only, and the request's own time starts once it is sent.
        try:
            async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
                await slots.acquire()
        except TimeoutError:
            raise LLMUnavailableError("out of time waiting for a free LLM slot", late) from None
        try:
            return await self._timed(messages, tools, model, call_functions, max_tokens, deadline)
        finally:
            slots.release()

    async def _timed(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        model: str,
        call_functions: bool,
        max_tokens: int,
        deadline: float | None,
    ) -> Completion:
        wait = self.timeout * (1 + self.max_retries)
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
        late = trouble("my language model is not answering in time")
        if wait <= 0:
            raise LLMUnavailableError("out of time for this message", late)
        # The request itself never times out first: the wait below decides.
        timeout = _request_timeout(math.ceil(wait) + 5.0, min(self.timeout, 10.0))
        request = RequestRun(self, model, tools, call_functions, max_tokens, timeout)
        try:
            # A timeout scope, not wait_for: no extra task per call.
            async with asyncio.timeout(wait):
                return await request.run(messages)
        except TimeoutError:
            raise LLMUnavailableError(f"no answer within {wait:.0f} s", late) from None

    def unavailable(self, error: Exception, model: str) -> LLMUnavailableError:
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
            return LLMUnavailableError("timed out after retries", trouble("my language model is not answering in time"))
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

    async def close(self) -> None:
        await self.client.close()


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


@functools.lru_cache(maxsize=64)
def _request_timeout(read: float, connect: float) -> openai.Timeout:
    """One Timeout per (whole-second) value: building one runs httpx's checks, about
    1% of the bot's CPU per call under load. Immutable, so calls may share it."""
    return openai.Timeout(read, connect=connect)


__all__ = [
    "SAVED",
    "Completion",
    "ContextLimitError",
    "LLMClient",
    "LLMUnavailableError",
    "TokenUsage",
    "ToolCall",
    "trouble",
]
