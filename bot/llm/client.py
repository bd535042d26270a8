"""The LLM client: any OpenAI-compatible chat-completions endpoint (OpenAI,
llama.cpp's servers, Ollama, vLLM), behind one call: `LLMClient.complete`
takes a `Request` and gives back a `Completion` with the server's usage
(bot/llm/types.py), or an `LLMUnavailableError` with a message a person can
act on, never another exception.

One request is sent until it is taken or cannot be (`RequestRun`). The
messages go in the shape every server accepts (bot/llm/shape.py), without
what the endpoint already refused (`Endpoint`, below). When the server
refuses the request (bot/llm/refusals.py says what a refusal means):

- a parameter it does not take is dropped (or renamed, max_tokens to
  max_completion_tokens) and the request sent again; the endpoint remembers;
- a prompt over its context limit is the caller's to shrink: ContextLimitError;
- anything else about the request is its shape: the request is repaired, level
  by level (the messages the refusal names dropped, then function calls as
  text, then the newest message alone), each sent once without the client's
  retries. What made it pass is remembered for the endpoint's later requests,
  and the operator is told once. A refusal no repair lifts is an
  LLMUnavailableError with one clear note for the person; nothing of it stays
  in what the next request sends, so the next message can succeed.

What the client learns about its endpoint while talking to it (`Endpoint`, one
per client, shared by every agent of the process):

- parameters the server refused (sent once, then never again);
- repairs its refusals needed: messages to leave out (by fingerprint), and
  whether function calls must go as plain text;
- per model, the server's own context limit when it named one, and the ratio
  between the server's prompt token count and ours (its tokenizer and chat
  template are not tiktoken): from the usage it reports on every call, and
  from its context-limit refusals. The queue manager leaves that margin.
- a cap on requests in flight (MEMGPT_LLM_CONCURRENCY): a single-slot server
  (llama-cpp-python, llama-server without --parallel) answers one at a time,
  so more only wait at the server, where a timeout cannot see them;
- whether its chat template dropped the functions (`Endpoint.check_tools`).

Answers are streamed where the server takes it (a refusal of `stream` is a refused
parameter), read no further than the reply budget (bot/llm/types.py: read_answer);
a step's call the stream cannot carry is asked for by name (bot/llm/named_calls.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, cast

import httpx2
import openai
from openai._types import RequestOptions

from bot import metrics
from bot.llm import named_calls, shape
from bot.llm.refusals import Refusal, classify, refusal_summary, unavailable, unrepaired
from bot.llm.types import (
    LATE,
    BrokenAnswer,
    Completion,
    ContextLimitError,
    LLMUnavailableError,
    Request,
    read_answer,
    trouble,
)

log = logging.getLogger(__name__)

MAX_PARAMETER_FIXES = 3
# Ratios from small prompts are noise (a few tokens of template dominate).
MIN_TOKENS_FOR_RATIO = 200
MAX_RATIO = 4.0
# An observation above the estimate is taken at once (the next prompt must fit);
# below it, the estimate comes down slowly.
RATIO_DECAY = 0.1
# A refusal whose count is this far above every answered prompt's (once a few were answered)
# is doubted once: llama-cpp-python's function calling writes a call's arguments without
# max_tokens and refuses its own follow-up prompt, naming its window + 1 tokens for a prompt
# it counted at 1.05 of ours: taken as a ratio (1.24), it shrank the window below the fixed prompt.
DOUBTFUL_REFUSAL = 1.15
ANSWERS_BEFORE_DOUBT = 3
STREAM_OPTIONS = {"include_usage": True}
# (llama-server's --chat-template chatml renders no tools either: tried with SmolLM2.)
TOOLS_FIX = "llama-server: --jinja --chat-template-file with one that does, e.g. Qwen2.5's for a ChatML model"


class LLMClient:
    """One OpenAI-compatible endpoint. Each request is shaped for every common
    server (bot/llm/shape.py), carries a `max_tokens`, waits for a free slot
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
    (bot/llm/refusals.py says what each means)."""

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
        self.encode = shape.RequestEncoder().encode
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

    async def complete(self, request: Request) -> Completion:
        """One chat completion, in the client's model unless the request names another."""
        started = time.perf_counter()
        model = request.model or self.model
        try:
            completion = await self._bounded(request, model)
            metrics.record_llm_call(time.perf_counter() - started, completion.usage)
        except LLMUnavailableError as error:
            metrics.record_llm_call(time.perf_counter() - started, None)
            if isinstance(error, ContextLimitError):
                self.endpoint.learn_context_limit(model, error.limit)
                if error.server_prompt_tokens and request.prompt_tokens:
                    self.endpoint.observe(model, error.server_prompt_tokens, request.prompt_tokens, refused=True)
            # Some OpenAI-compatible servers and proxies quote the key they refused
            # in the error body, which our error text (logged) carries along.
            reason = str(error)
            if len(self._api_key) < 8 or self._api_key not in reason:
                raise
            # `from None`: the SDK's own exception in the chain holds the key too.
            raise LLMUnavailableError(reason.replace(self._api_key, "***"), error.user_message) from None
        if completion.tool_calls:
            self.endpoint.calls_seen = True
        elif request.prompt_tokens and completion.usage.prompt and not completion.repaired:
            self.endpoint.check_tools(completion.usage.prompt, request)
        if request.prompt_tokens and completion.usage.prompt and not completion.repaired:
            self.endpoint.observe(model, completion.usage.prompt, request.prompt_tokens)
        return completion

    def limits(self, model: str | None = None) -> ModelLimits:
        """What the endpoint taught about `model`: its token ratio and context limit."""
        return self.endpoint.limits(model or self.model)

    async def _bounded(self, request: Request, model: str) -> Completion:
        slots = self.endpoint.slots()
        if slots is None:
            return await self._timed(request, model)
        # Waiting for a free slot is our queue, not the server's slowness: bounded by
        # the message's deadline only, and the request's own time starts once it is sent.
        deadline = request.deadline
        try:
            async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
                await slots.acquire()
        except TimeoutError:
            raise LLMUnavailableError("out of time waiting for a free LLM slot", trouble(LATE)) from None
        try:
            return await self._timed(request, model)
        finally:
            slots.release()

    async def _timed(self, request: Request, model: str) -> Completion:
        wait = self.timeout * (1 + self.max_retries)
        if request.deadline is not None:
            wait = min(wait, request.deadline - time.monotonic())
        if wait <= 0:
            raise LLMUnavailableError("out of time for this message", trouble(LATE))
        # The request itself never times out first: the wait below decides.
        timeout = _request_timeout(math.ceil(wait) + 5.0, min(self.timeout, 10.0))
        run = RequestRun(self, model, request, timeout)
        try:
            # A timeout scope, not wait_for: no extra task per call.
            async with asyncio.timeout(wait):
                return await run.run()
        except TimeoutError:
            raise LLMUnavailableError(f"no answer within {wait:.0f} s", trouble(LATE)) from None

    async def close(self) -> None:
        await self.client.close()


@dataclass(slots=True)
class RequestRun:
    """One request, sent until it is taken or cannot be (see the module's words)."""

    client: LLMClient
    model: str
    request: Request
    timeout: openai.Timeout
    # The refusal a repair answered, and what to remember once the repair passes.
    _refusal: Refusal | None = field(default=None, init=False)
    _pending: tuple[int, frozenset[str]] = field(default=(0, frozenset()), init=False)
    _dropped: bool = field(default=False, init=False)
    streamed: bool = field(default=True, init=False)  # False once a stream broke off (asked again without)
    by_name: bool = field(default=False, init=False)  # a step's stream broke off: its call asked by name

    async def run(self) -> Completion:
        attempt = self._known_repairs(shape.portable(self.request.messages))
        levels, level, fixes = list(shape.LEVELS), 0, 0
        # An answer that broke off mid-body is asked for again as the client's own
        # retries would (they end once the status line is in).
        rereads = self.client.max_retries
        while True:
            body = self._body(attempt)
            # Where named calls stream, a streamed choice carries nothing: asked by name at once (named_calls.py).
            self.by_name = self.by_name or (self.client.endpoint.names_calls and named_calls.asks_a_choice(body))
            try:
                completion = None if self.by_name else await self._answer(body, retries=not level)
                if completion is None or (not completion.tool_calls and named_calls.left_no_words(body, completion)):
                    answer = functools.partial(self._answer, retries=False)
                    completion = await named_calls.by_name(answer, body, completion, self.request, self.client.endpoint)
            except BrokenAnswer as broken:
                if "stream" in body and self.streamed and not isinstance(broken.error, openai.APITimeoutError):
                    if named_calls.asks_a_choice(body) and not self.by_name:
                        self.by_name = True  # a step's call its stream could not carry (llama-cpp-python's)
                    else:
                        self.streamed = False  # asked once more, not streamed
                    self.client.endpoint.tell_once("unstreamed", f"a streamed answer broke off ({broken}): asked again")
                    continue
                if rereads and not level and not isinstance(broken.error, openai.APITimeoutError):
                    rereads -= 1
                    continue
                raise unavailable(broken.error, self.model) from broken.cause
            except openai.APIStatusError as error:
                refusal = classify(error, body)
                if refusal is None:
                    raise unavailable(error, self.model) from error
                if refusal.over_context:
                    raise ContextLimitError(
                        f"over the server's context: {refusal.text[:300]}",
                        refusal.context_limit,
                        refusal.server_prompt_tokens,
                    ) from error
                if refusal.parameter and fixes < MAX_PARAMETER_FIXES:
                    fixes += 1
                    self._without_parameter(refusal)
                    continue
                repaired = None
                while repaired is None and levels:
                    level = levels.pop(0)
                    repaired = shape.repair(attempt, level, refusal.text)
                if repaired is None:
                    raise unrepaired(refusal) from error
                log.info("LLM server refused a request (%s); retrying it repaired", refusal_summary(refusal))
                self._remember(level, attempt, repaired, refusal)
                self._dropped = self._dropped or level != shape.TOOLS_AS_TEXT
                attempt = repaired
                continue
            except (openai.APIError, ValueError) as error:
                raise unavailable(error, self.model) from error
            # Messages left out: our count of the prompt is not the server's to compare.
            completion.repaired = self._dropped
            if level:
                self._learned(level)
            return completion

    async def _answer(self, body: dict[str, Any], *, retries: bool) -> Completion:
        """The answer to `body`, read as far as the bot uses it (stream=True at the HTTP level, whether the
        server streams or not). The low-level post keeps the client's retries, auth and errors, without its
        typed-params transform (~10 ms a call on a full context); we encode the JSON (the schemas once)."""
        options: RequestOptions = {"timeout": self.timeout}
        if not retries:
            options["max_retries"] = 0
        raw, unread = self.client.encode(body), openai.AsyncStream[Any]  # the body is ours to read
        sent = self.client.client.post(
            "/chat/completions", content=raw, cast_to=httpx2.Response, options=options, stream=True, stream_cls=unread
        )
        response = cast(httpx2.Response, await sent)
        request = self.request
        try:
            # Not JSON (a proxy's HTML page sent with status 200): a ValueError,
            # which `unavailable` words for the person.
            answer, cut = await read_answer(response, request.max_tokens, request.count_tokens)
        except httpx2.TransportError as error:
            # As the client words a failed request: a timeout, or a lost connection.
            kind = openai.APITimeoutError if isinstance(error, httpx2.TimeoutException) else openai.APIConnectionError
            worded = kind(request=response.request)
            worded.__cause__ = error  # `unavailable` reads the cause (a refused connection)
            raise BrokenAnswer(worded, error) from error
        finally:
            with contextlib.suppress(httpx2.TransportError):
                await response.aclose()  # before the end of the answer: the server stops writing
        if cut:
            note = f"the LLM server wrote past max_tokens ({request.max_tokens}): answers are read to a budget"
            self.client.endpoint.tell_once("cut", note)
        return answer

    # -- what the endpoint learned ---------------------------------------------
    def _known_repairs(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        endpoint = self.client.endpoint
        if endpoint.dropped_messages:
            drop = [i for i, m in enumerate(messages) if shape.fingerprint(m) in endpoint.dropped_messages]
            if drop:
                messages = shape.drop_messages(messages, drop)
                self._dropped = True
        if endpoint.tools_as_text:
            messages = shape.tools_as_text(messages)
        return messages

    def _remember(
        self, level: int, before: list[dict[str, Any]], after: list[dict[str, Any]], refusal: Refusal
    ) -> None:
        """Noted now, kept for the endpoint only if the repaired request passes."""
        self._refusal = refusal
        kept = {shape.fingerprint(m) for m in after}
        gone = frozenset({shape.fingerprint(m) for m in before} - kept if level == shape.DROP_NAMED else ())
        self._pending = (level, gone)

    def _learned(self, level: int) -> None:
        """The repair at `level` passed: later requests get it up front (the newest-only
        repair is for this request alone: sent always, it would forget the conversation)."""
        endpoint = self.client.endpoint
        pending_level, gone = self._pending
        if pending_level == shape.DROP_NAMED:
            endpoint.dropped_messages.update(gone)
        elif pending_level == shape.TOOLS_AS_TEXT:
            endpoint.tools_as_text = True
        endpoint.tell_once(
            f"repair:{level}",
            f"the LLM server refused requests ({refusal_summary(self._refusal)}); "
            f"repaired: {shape.LEVEL_NAMES[level]} (recall storage keeps every message)",
        )

    def _without_parameter(self, refusal: Refusal) -> None:
        endpoint = self.client.endpoint
        name = refusal.parameter or ""
        if name == "max_tokens" and "max_completion_tokens" in refusal.text.lower():
            endpoint.renamed_parameters["max_tokens"] = "max_completion_tokens"
            what = "sends max_completion_tokens instead of max_tokens"
        else:
            endpoint.dropped_parameters.add(name)
            what = f"no longer sends {name}"
        endpoint.tell_once(
            f"parameter:{name}", f"the LLM server refused the parameter {name} ({refusal.text[:160]}); the bot {what}"
        )

    def _body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        endpoint = self.client.endpoint
        request = self.request
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        tool_choice_ok = "tool_choice" not in endpoint.dropped_parameters
        # A summary (no function calls wanted) goes without tools where tool_choice "none" is refused.
        tools_ok = "tools" not in endpoint.dropped_parameters
        if request.tools and tools_ok and (request.call_functions or tool_choice_ok):
            body["tools"] = request.tools
            if tool_choice_ok:
                choice = "auto" if request.call_functions else "none"  # named: plain_answer's (bot/agent_calls.py)
                body["tool_choice"] = named_calls.choice(request.named_function) if request.named_function else choice
        if request.max_tokens > 0:
            name = endpoint.renamed_parameters.get("max_tokens", "max_tokens")
            if name not in endpoint.dropped_parameters:
                body[name] = request.max_tokens
        if self.streamed and "stream" not in endpoint.dropped_parameters:
            body["stream"] = True
            if "stream_options" not in endpoint.dropped_parameters:
                body["stream_options"] = STREAM_OPTIONS  # the usage comes in the last event
        return body


# -- what the client learns about its endpoint ---------------------------------
@dataclass(slots=True)
class ModelLimits:
    ratio: float = 1.0  # server tokens per tiktoken token, never below 1
    context_limit: int = 0  # the server's window, 0: unknown (ours holds)
    observations: int = 0
    highest_answered: float = 0.0  # the highest ratio of a prompt the server answered
    doubted: bool = False  # the last refusal's count was doubted (the next one is believed)


@dataclass
class Endpoint:
    concurrency: int = 0  # 0: no cap
    dropped_parameters: set[str] = field(default_factory=set)
    renamed_parameters: dict[str, str] = field(default_factory=dict)
    dropped_messages: set[str] = field(default_factory=set)
    tools_as_text: bool = False
    # The model called a function; the server's counts showed the schemas left out (check_tools).
    calls_seen: bool = False
    tools_dropped: bool = False
    names_calls: bool = False  # a call asked for by name came back streamed (bot/llm/named_calls.py)
    _short_counts: int = 0  # answers without a call whose count looked so (two make it so)
    models: dict[str, ModelLimits] = field(default_factory=dict)
    _slots: asyncio.Semaphore | None = None
    _told: set[str] = field(default_factory=set)

    def limits(self, model: str) -> ModelLimits:
        return self.models.setdefault(model, ModelLimits())

    def slots(self) -> asyncio.Semaphore | None:
        if self.concurrency <= 0:
            return None
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        return self._slots

    def observe(self, model: str, server_tokens: int, our_tokens: int, *, refused: bool = False) -> bool:
        """One call's prompt, counted by the server and by us (`refused`: the count
        its over-context refusal named). False when the count taught nothing."""
        if our_tokens < MIN_TOKENS_FOR_RATIO or server_tokens <= 0:
            return False
        limits = self.limits(model)
        seen = min(MAX_RATIO, server_tokens / our_tokens)
        if not refused:
            limits.highest_answered = max(limits.highest_answered, seen)
            limits.doubted = False
        elif (
            limits.observations >= ANSWERS_BEFORE_DOUBT
            and seen > limits.highest_answered * DOUBTFUL_REFUSAL
            and not limits.doubted
        ):
            limits.doubted = True  # a second such refusal in a row is believed
            self.tell_once(
                f"doubted:{model}",
                f"the LLM server refused a prompt as over its context naming {server_tokens} tokens, {seen:.2f} "
                f"of our count where every answered prompt was at most {limits.highest_answered:.2f}: taken as "
                "the server counting its own generation in (llama-cpp-python's function calling does), "
                "not as its count of our prompts; the prompt is flushed once more instead",
            )
            return False
        before = limits.ratio
        if seen >= limits.ratio:
            limits.ratio = seen
        else:
            limits.ratio = max(1.0, limits.ratio + (seen - limits.ratio) * RATIO_DECAY)
        limits.observations += not refused
        if limits.ratio > 1.02 and before <= 1.02:
            self.tell_once(
                f"ratio:{model}",
                f"the LLM server counts {limits.ratio:.2f} tokens for each of ours (its own tokenizer) "
                f"for model {model}; prompts now leave that margin",
            )
        return True

    def check_tools(self, server_tokens: int, request: Request) -> None:
        """Whether the server rendered the functions offered, from answers without a call: a chat template
        that ignores tools (SmolLM2's in llama-server --jinja) counts the prompt nearer our count without them."""
        tools = request.tool_tokens
        if self.tools_dropped or self.calls_seen or not request.call_functions or tools < MIN_TOKENS_FOR_RATIO:
            return
        without = request.prompt_tokens - tools
        if server_tokens >= without + tools / 2:  # nearer the count with them
            return
        self._short_counts += 1
        self.tools_dropped = self._short_counts >= 2  # then the steps go without them (bot/agent_calls.py)
        if not self.tools_dropped:
            return
        self.tell_once(
            "tools dropped",
            f"the LLM server left the functions out of the prompt: it counted {server_tokens} prompt tokens where the "
            f"bot counts {request.prompt_tokens} with the function schemas, {without} without. Its chat template "
            "ignores tools: the model cannot save a memory or call a function, and is asked for plain text only. "
            f"Fix: serve it with a chat template that renders tools ({TOOLS_FIX}), or use a model whose own "
            "template supports tool calls",
        )

    def learn_context_limit(self, model: str, limit: int | None) -> None:
        if not limit:
            return
        limits = self.limits(model)
        if limits.context_limit != limit:
            limits.context_limit = limit
            self.tell_once(f"limit:{model}:{limit}", f"the LLM server's context limit for {model} is {limit} tokens")

    def tell_once(self, key: str, text: str) -> None:
        """A note for the operator, once per process."""
        if key not in self._told:
            self._told.add(key)
            log.warning("%s", text)


@functools.lru_cache(maxsize=64)
def _request_timeout(read: float, connect: float) -> openai.Timeout:
    """One Timeout per (whole-second) value: building one runs httpx's checks, about
    1% of the bot's CPU per call under load. Immutable, so calls may share it."""
    return openai.Timeout(read, connect=connect)
