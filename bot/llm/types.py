"""The client's types: the `Request` it is given, the `Completion` it gives
back with the server's `TokenUsage`, and the errors a person is told about;
and reading an answer.

A request asks for a streamed answer (server-sent events) wherever the server
takes one, so the bot decides how much it reads (`read_answer`): a server may
run on past the request's `max_tokens` (llama-cpp-python's
chatml-function-calling writes a call's arguments to the end of its context).
Reading stops at the reply budget, counted in the bot's own tokens, and the
caller closes the connection, which is what makes llama.cpp's servers stop
generating. The pieces are put back together into the body a non-streamed
answer has (`choices[0].message`, `usage`, llama-server's `timings`); a server
that ignores `stream` and sends one JSON body is read as that body.

What the server answered is read defensively (`parse_completion`): whatever it
sends, the caller gets a `Completion` of plain strings or an
`LLMUnavailableError`, never another exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from bot.sanitize import fix_surrogates

# Every note the person gets says: what is wrong, that their message is kept, and
# that they can try again (tests/test_llm_fault_property.py checks all three).
SAVED = "Your message is saved; please try again"
LATE = "my language model is not answering in time"


def trouble(what: str, when: str = "shortly") -> str:
    return f"I'm having trouble: {what}. {SAVED} {when}."


@dataclass(slots=True)
class Request:
    """One chat completion to ask for."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    model: str | None = None  # None: the client's (another: a cheaper summarizer)
    call_functions: bool = True  # False: tool_choice "none" (a summary from the agent's own prompt)
    max_tokens: int = 0  # the answer's cap; 0: none sent
    deadline: float | None = None  # a time.monotonic() by which to give up
    # Our count of the prompt, compared with the server's to learn its ratio
    # (bot/llm/client.py: Endpoint); 0: nothing to learn from this request.
    prompt_tokens: int = 0
    # Our count of the function schemas' share of `prompt_tokens`: a server whose
    # count is near the prompt without them left them out (its chat template).
    tool_tokens: int = 0
    # A piece of the answer in the bot's tokens, to stop reading at `max_tokens`
    # (`read_answer`); None: a streamed piece counts one.
    count_tokens: Callable[[str], int] | None = None
    # The function whose call is the answer (the agent's), asked for by name where the
    # server's tool grammar left the model no words (bot/llm/named_calls.py).
    answer_function: str = "send_message"
    # The one function the answer must call (tool_choice naming it); "": the model's choice.
    named_function: str = ""


@dataclass(slots=True)
class TokenUsage:
    """Tokens of LLM calls: the prompt, how many of its tokens the server said it
    had cached, and the completion. A `Completion`'s are the server's counts (0
    where it does not say); the agent's own are counted locally (bot/agent_calls.py)."""

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
    # The server's counts (`usage`): `prompt_tokens`, `completion_tokens`, and the
    # prompt tokens it served from its prompt cache (`prompt_tokens_details.cached_tokens`:
    # OpenAI, vLLM); 0 where it does not say.
    usage: TokenUsage = field(default_factory=TokenUsage)
    finish_reason: str = ""
    # What was sent differs from what was asked (a repair, bot/llm/client.py).
    repaired: bool = False
    content_is_text: bool = True


class BrokenAnswer(Exception):
    """The answer's body broke off: `error` is the client's word for it."""

    def __init__(self, error: Exception, cause: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
        self.cause = cause


class ContextLimitError(LLMUnavailableError):
    """The server said the prompt is over its context limit (bot/llm/refusals.py)."""

    def __init__(self, reason: str, limit: int | None, server_prompt_tokens: int | None) -> None:
        super().__init__(reason, trouble("my memory is too full for my language model", "in a moment"))
        self.limit = limit
        self.server_prompt_tokens = server_prompt_tokens


# -- reading an answer ----------------------------------------------------------
# Room over `max_tokens` before a streamed answer is cut: the server counts with its
# own tokenizer, and an answer it would end by itself is not cut short.
BUDGET_SLACK = 2.0
BUDGET_EXTRA = 16


def reply_budget(max_tokens: int) -> int:
    """Tokens (ours) read before a streamed answer is cut; 0: no cut."""
    return int(max_tokens * BUDGET_SLACK) + BUDGET_EXTRA if max_tokens > 0 else 0


def one_per_piece(piece: str) -> int:
    """The count when the caller gave none: servers stream about a token a piece."""
    return 1 if piece else 0


async def read_answer(
    response: httpx2.Response, max_tokens: int, count: Callable[[str], int] | None
) -> tuple[Completion, bool]:
    """The answer, and whether it was cut at the reply budget for `max_tokens` (0: read
    to the end); the caller closes the response. A body that is not JSON raises ValueError; a
    dropped connection, httpx2's TransportError; no answer, LLMUnavailableError."""
    if "text/event-stream" not in response.headers.get("content-type", ""):  # the server did not stream
        return parse_completion(json.loads(await response.aread())), False
    answer, done = StreamedAnswer(reply_budget(max_tokens), count or one_per_piece), False
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # comments (": ping"), event names, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        if not answer.add(json.loads(data)):
            break
    if not (done or answer.finish_reason or answer.cut or answer.error is not None):
        # llama-cpp-python's chatml-function-calling raises inside a streamed function call
        # ("Automatic streaming tool choice is not supported"): the stream just stops.
        raise httpx2.RemoteProtocolError("the stream ended before the answer did")
    return parse_completion(answer.body()), answer.cut


@dataclass(slots=True)
class StreamedAnswer:
    budget: int
    count: Callable[[str], int]
    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Any = None
    timings: Any = None
    error: Any = None
    # The answer's length so far: characters until they exceed the budget (a token
    # is at least one, so a short answer is never tokenized), then tokens.
    tokens: int = 0
    counting: bool = False
    cut: bool = False

    def add(self, chunk: Any) -> bool:
        """One event's chunk; False once the answer is over the budget (or an error came)."""
        if not isinstance(chunk, dict):
            return True
        if chunk.get("error") is not None:
            self.error = chunk["error"]
            return False
        self.usage = chunk.get("usage") or self.usage
        self.timings = chunk.get("timings") or self.timings
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return True
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.content.append(content)
            self._measure(content)
        for index, piece in enumerate(delta.get("tool_calls") or []):
            if isinstance(piece, dict):
                self._add_call(piece, index)
        if self.budget and self.tokens > self.budget:
            self.cut = True
            return False
        return True

    def _measure(self, piece: str) -> None:
        if self.counting:
            self.tokens += self.count(piece)
            return
        self.tokens += len(piece)
        if self.budget and self.tokens > self.budget:
            self.counting = True  # from here in tokens: the whole answer once, then each piece
            calls = [call.get("function", {}) for call in self.calls.values()]
            pieces = ["".join(self.content), *(f"{f.get('name', '')}{f.get('arguments', '')}" for f in calls)]
            self.tokens = sum(self.count(text) for text in pieces if text)

    def _add_call(self, piece: dict[str, Any], position: int) -> None:
        index = piece.get("index")
        call = self.calls.setdefault(index if isinstance(index, int) else position, {"type": "function"})
        if piece.get("id"):
            call["id"] = piece["id"]
        function = piece.get("function")
        if not isinstance(function, dict):
            return
        target = call.setdefault("function", {"name": "", "arguments": ""})
        for key in ("name", "arguments"):
            value = function.get(key)
            if isinstance(value, dict):  # a server that sends the arguments as an object
                value = json.dumps(value, ensure_ascii=False)
            if key == "name" and value == target["name"]:
                continue  # the whole name again (llama-cpp-python's named calls repeat it in every chunk)
            if isinstance(value, str) and value:
                target[key] += value
                self._measure(value)

    def body(self) -> dict[str, Any]:
        if self.error is not None and not (self.content or self.calls):
            return {"error": self.error}
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) if self.content else None}
        if self.calls:
            message["tool_calls"] = [self.calls[index] for index in sorted(self.calls)]
        finish = "length" if self.cut else self.finish_reason
        body: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        if self.usage is not None:
            body["usage"] = self.usage
        if self.timings is not None:
            body["timings"] = self.timings
        return body


def parse_completion(response: Any) -> Completion:
    """The first choice's message, as plain strings. Nothing validates a 200
    body: it may be `{}`, a list, or have fields of any JSON type. A body with no
    message is an error; odd fields are coerced, so the agent's functions see strings
    and report bad calls to the model."""
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
    finish = _field(choice, "finish_reason")
    return Completion(
        content=text,
        tool_calls=calls,
        usage=_usage(_field(response, "usage"), _field(response, "timings")),
        finish_reason=finish if isinstance(finish, str) else "",
        # A number or an object where the text belongs is coerced for the queue,
        # but it is no answer to send a person.
        content_is_text=isinstance(content, str)
        or (isinstance(content, list) and all(isinstance(part, dict) for part in content)),
    )


def _usage(usage: Any, timings: Any = None) -> TokenUsage:
    """The server's counts, each 0 unless it sent a sensible one (the cached count,
    `prompt_tokens_details.cached_tokens`: OpenAI, vLLM, newer llama-server; else
    llama-server's `timings.cache_n`, the prompt tokens it did not process again)."""
    cached = _field(_field(usage, "prompt_tokens_details"), "cached_tokens")
    if not _count(cached):
        cached = _field(timings, "cache_n")
    return TokenUsage(
        _count(_field(usage, "prompt_tokens")), _count(cached), _count(_field(usage, "completion_tokens"))
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


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
