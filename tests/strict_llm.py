"""Strict modes for the scripted LLM server (tests/fake_llm.py): the ways the
servers people self-host differ from OpenAI, so that tests can show the bot
copes with each. Test tool only.

    server.strict = Strict(null_content=True, context_limit=3000, token_ratio=1.2, slots=1)

- `null_content`: llama-cpp-python's pydantic schema: a message whose content is
  not a string (null beside tool_calls), a tool message without a string
  `tool_call_id`, is refused with HTTP 500 "N validation errors" naming each
  message's index.
- `alternating_roles`: a chat template without tool support (llama.cpp's Jinja
  templates): a tool message, a call, or two messages of one role in a row
  are refused with 500 "Conversation roles must alternate ...".
- `refuse_message`: a predicate; a message it matches is refused by index (a
  content the server's validation does not take).
- `refuse_parameters`: request parameters refused with 400 (OpenAI's wording).
- `context_limit` and `context_style`: prompts over the limit are refused
  with 400 in llama-server's words ("llama.cpp": its count and n_ctx) or
  OpenAI's, as llama-cpp-python and vLLM say it ("openai": prompt and
  completion counted together).
- `runaway`: a predicate; a request with tools it matches is refused as
  llama-cpp-python's function calling refuses its own follow-up prompt after
  generating a call's arguments without the request's max_tokens to the end
  of its window: "openai" style, naming `context_limit` + 1 tokens in the
  messages, whatever the prompt sent.
- `schemas_need_calls`: a request with tool_choice "none" is counted without
  its function schemas (llama-cpp-python renders no tools when no call may be made).
- `token_ratio`: the server's prompt count is tiktoken's times this (its own
  tokenizer and template); it is what `usage.prompt_tokens` reports.
- `slots` and `seconds`: a server that works on `slots` requests at a time,
  each taking `seconds`, and goes on working on a request whose client gave
  up (as llama.cpp does with a non-streamed one).

Every refusal is also kept in `refusals` (status, text), and every request
the server worked on in `worked` (its prompt count), for the tests' checks.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memory.tokens import TokenCounter, load_encoder
from tests.fake_llm import CompletionReply, JSONDict, StatusFault, _Handler

COUNTER = TokenCounter(load_encoder("test-model"))


@dataclass
class Strict:
    null_content: bool = True
    alternating_roles: bool = False
    refuse_message: Callable[[JSONDict], bool] | None = None
    refuse_parameters: tuple[str, ...] = ()
    runaway: Callable[[JSONDict], bool] | None = None
    schemas_need_calls: bool = False
    context_limit: int = 0
    context_style: str = "llama.cpp"
    token_ratio: float = 1.0
    # A transcript (a request without tools: a summary of rendered messages) may count
    # otherwise: llama-server counted 1.4 times ours on those (issue 21).
    transcript_token_ratio: float | None = None
    slots: int = 0
    seconds: float = 0.0
    refusals: list[tuple[int, str]] = field(default_factory=list)
    # Each request taken: the server's count of its prompt, and its max_tokens.
    worked: list[tuple[int, int]] = field(default_factory=list)
    most_in_flight: int = 0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _slots: threading.Semaphore | None = None

    def prompt_tokens(self, body: JSONDict) -> int:
        ratio = self.token_ratio
        if self.transcript_token_ratio is not None and not body.get("tools"):
            ratio = self.transcript_token_ratio
        tools = body.get("tools") or ()
        if self.schemas_need_calls and body.get("tool_choice") == "none":
            tools = ()
        return int(COUNTER.count_request(body.get("messages", []), tools) * ratio)

    def serve(self, h: _Handler, body: JSONDict) -> None:
        refusal = self.check(body)
        if refusal is not None:
            status, error = refusal
            with self._lock:
                self.refusals.append((status, json.dumps(error)))
            StatusFault(status, {"error": error}).respond(h, body)
            return
        if self.slots and self._slots is None:
            with self._lock:
                if self._slots is None:
                    self._slots = threading.Semaphore(self.slots)
        if self._slots is not None:
            self._slots.acquire()
        try:
            with self._lock:
                self._in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self._in_flight)
                answer = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
                self.worked.append((self.prompt_tokens(body), answer))
            if self.seconds:
                time.sleep(self.seconds)  # busy: even when the client has gone
            reply = h.next_reply(body)
        finally:
            with self._lock:
                self._in_flight -= 1
            if self._slots is not None:
                self._slots.release()
        if isinstance(reply, CompletionReply) and reply.usage is None:
            prompt = self.prompt_tokens(body)
            completion = COUNTER.count(reply.content or "") + sum(
                COUNTER.count(call.arguments) + 4 for call in reply.tool_calls
            )
            usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
            reply = dataclasses.replace(reply, usage=usage)
        reply.respond(h, body)

    def check(self, body: JSONDict) -> tuple[int, JSONDict] | None:
        for name in self.refuse_parameters:
            if name in body:
                hint = " Use 'max_completion_tokens' instead." if name == "max_tokens" else ""
                message = f"Unsupported parameter: '{name}' is not supported with this model.{hint}"
                return 400, {"message": message, "type": "invalid_request_error", "param": name, "code": None}
        messages = body.get("messages", [])
        errors = []
        for index, message in enumerate(messages):
            if self.null_content and not isinstance(message.get("content"), str):
                errors.append(f"messages.{index}.content\n  Input should be a valid string [type=string_type]")
            if self.null_content and message.get("role") == "tool" and not isinstance(message.get("tool_call_id"), str):
                errors.append(f"messages.{index}.tool_call_id\n  Field required [type=missing]")
            if self.refuse_message is not None and self.refuse_message(message):
                errors.append(f"messages.{index}.content\n  Value error, content not supported [type=value_error]")
        if errors:
            message = f"{len(errors)} validation errors for ChatCompletionRequest\n" + "\n".join(errors)
            return 500, {"message": message, "type": "internal_server_error", "param": None, "code": None}
        if self.alternating_roles and not _alternate(messages):
            message = "Conversation roles must alternate user/assistant/user/assistant/..."
            return 500, {"message": message, "type": "server_error", "param": None, "code": None}
        if self.context_limit:
            prompt = self.prompt_tokens(body)
            answer = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
            if self.runaway is not None and body.get("tools") and self.runaway(body):
                return 400, self._openai_context_error(self.context_limit + 1, answer)
            if self.context_style == "llama.cpp" and prompt >= self.context_limit:
                return 400, {
                    "code": 400,
                    "message": f"request ({prompt} tokens) exceeds the available context size "
                    f"({self.context_limit} tokens), try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": prompt,
                    "n_ctx": self.context_limit,
                }
            if self.context_style == "openai" and prompt + answer > self.context_limit:
                return 400, self._openai_context_error(prompt, answer)
        return None

    def _openai_context_error(self, prompt: int, answer: int) -> JSONDict:
        message = (
            f"This model's maximum context length is {self.context_limit} tokens. However, you requested "
            f"{prompt + answer} tokens ({prompt} in the messages, {answer} in the completion). "
            "Please reduce the length of the messages or completion."
        )
        return {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }


def _alternate(messages: list[JSONDict]) -> bool:
    roles = [m.get("role") for m in messages if m.get("role") != "system"]
    if any(role not in ("user", "assistant") for role in roles) or any(m.get("tool_calls") for m in messages):
        return False
    return all(a != b for a, b in itertools.pairwise(roles)) and (not roles or roles[0] == "user")


def received(server: Any) -> list[bytes]:
    """The raw bodies of every chat request the server received."""
    return [r.raw_body for r in server.raw_requests if r.path.endswith("/chat/completions")]


def wall(started: float) -> float:
    return time.monotonic() - started
