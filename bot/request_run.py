"""One request to the LLM server, sent until it is taken or cannot be.

The messages go in the shape every server accepts (bot/request_shape.py),
without what the endpoint already refused (bot/endpoint.py). When the server
refuses the request (bot/refusals.py says what a refusal means):

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

The body goes as JSON bytes encoded here (RequestEncoder): the function schemas
are about half of an ordinary request and the same in every request the agents
make, yet the costliest part to encode (many small nested objects), so each
list of schemas is encoded once and its bytes spliced into every body that
carries it. The bytes are those the openai client would send for the same body.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import openai
from openai._types import RequestOptions

from bot import metrics, request_shape
from bot.completion import Completion, ContextLimitError, LLMUnavailableError, parse_completion, trouble
from bot.refusals import Refusal, classify

if TYPE_CHECKING:
    from bot.llm import LLMClient

log = logging.getLogger(__name__)

MAX_PARAMETER_FIXES = 3


@dataclass(slots=True)
class RequestRun:
    client: LLMClient
    model: str
    tools: list[dict[str, Any]] | None
    call_functions: bool
    max_tokens: int
    timeout: openai.Timeout
    # The refusal a repair answered, and what to remember once the repair passes.
    _refusal: Refusal | None = field(default=None, init=False)
    _pending: tuple[int, set[str]] = field(default_factory=lambda: (0, set()), init=False)
    _dropped: bool = field(default=False, init=False)

    async def run(self, messages: list[dict[str, Any]]) -> Completion:
        attempt, levels, level, fixes = (
            self._known_repairs(request_shape.portable(messages)),
            list(request_shape.LEVELS),
            0,
            0,
        )
        while True:
            body = self._body(attempt)
            try:
                # The low-level post keeps the client's retries, auth and error types but
                # skips its typed-params transform, which walks every message of the
                # request in Python and cost ~10 ms per call on a full context. Our
                # messages are already plain API-shaped dicts, sent as JSON we encode
                # (the function schemas once, not on every call), and the answer is
                # read raw, not into the client's typed models: together about a
                # tenth of the CPU of an event with an instant model. A repair is sent once.
                options: RequestOptions = {"timeout": self.timeout}
                if level:
                    options["max_retries"] = 0
                raw = await self.client.client.post(
                    "/chat/completions", content=self.client.encode(body), cast_to=bytes, options=options
                )
                # Not JSON (a truncated body, a proxy's HTML page sent with status 200): a
                # ValueError, which `unavailable` below words for the person.
                response = json.loads(raw)
            except openai.APIStatusError as error:
                refusal = classify(error, body)
                if refusal is None:
                    raise self.client.unavailable(error, self.model) from error
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
                    repaired = request_shape.repair(attempt, level, refusal.text)
                if repaired is None:
                    raise self._refused(refusal) from error
                log.info("LLM server refused a request (%s); retrying it repaired", refusal_summary(refusal))
                self._remember(level, attempt, repaired, refusal)
                self._dropped = self._dropped or level != request_shape.TOOLS_AS_TEXT
                attempt = repaired
                continue
            except (openai.APIError, ValueError) as error:
                raise self.client.unavailable(error, self.model) from error
            completion = parse_completion(response)
            # Messages left out: our count of the prompt is not the server's to compare.
            completion.repaired = self._dropped
            # Counted once parsed: a body that does not parse is counted by complete() as an error.
            metrics.record_tokens(completion)
            if level:
                self._learned(level)
            return completion

    # -- what the endpoint learned ---------------------------------------------
    def _known_repairs(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        endpoint = self.client.endpoint
        if endpoint.dropped_messages:
            drop = [i for i, m in enumerate(messages) if request_shape.fingerprint(m) in endpoint.dropped_messages]
            if drop:
                messages = request_shape.drop_messages(messages, drop)
                self._dropped = True
        if endpoint.tools_as_text:
            messages = request_shape.tools_as_text(messages)
        return messages

    def _remember(
        self, level: int, before: list[dict[str, Any]], after: list[dict[str, Any]], refusal: Refusal
    ) -> None:
        """Noted now, kept for the endpoint only if the repaired request passes."""
        self._refusal = refusal
        kept = {request_shape.fingerprint(m) for m in after}
        gone = {request_shape.fingerprint(m) for m in before} - kept if level == request_shape.DROP_NAMED else set()
        self._pending = (level, gone)

    def _learned(self, level: int) -> None:
        """The repair at `level` passed: later requests get it up front (the newest-only
        repair is for this request alone: sent always, it would forget the conversation)."""
        endpoint = self.client.endpoint
        pending_level, gone = self._pending
        if pending_level == request_shape.DROP_NAMED:
            endpoint.dropped_messages.update(gone)
        elif pending_level == request_shape.TOOLS_AS_TEXT:
            endpoint.tools_as_text = True
        endpoint.tell_once(
            f"repair:{level}",
            f"the LLM server refused requests ({refusal_summary(self._refusal)}); "
            f"repaired: {request_shape.LEVEL_NAMES[level]} (recall storage keeps every message)",
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
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        tool_choice_ok = "tool_choice" not in endpoint.dropped_parameters
        # A summary (no function calls wanted) goes without tools where tool_choice "none" is refused.
        tools_ok = "tools" not in endpoint.dropped_parameters
        if self.tools and tools_ok and (self.call_functions or tool_choice_ok):
            body["tools"] = self.tools
            if tool_choice_ok:
                body["tool_choice"] = "auto" if self.call_functions else "none"
        if self.max_tokens > 0:
            name = endpoint.renamed_parameters.get("max_tokens", "max_tokens")
            if name not in endpoint.dropped_parameters:
                body[name] = self.max_tokens
        return body

    def _refused(self, refusal: Refusal) -> LLMUnavailableError:
        return LLMUnavailableError(
            f"the LLM server refused the request, also repaired ({refusal_summary(refusal)})",
            trouble("my language model refused my request, even simplified (an admin can see why in the log)"),
        )


def refusal_summary(refusal: Refusal | None) -> str:
    return "" if refusal is None else f"HTTP {refusal.status}: {' '.join(refusal.text.split())[:200]}"


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
