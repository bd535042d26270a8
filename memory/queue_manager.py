"""The FIFO queue and its manager: what the model sees, and what must leave.

The prompt is laid out for providers' prompt caches, which serve only a prefix
that repeats exactly from the first token: what changes least comes first.
One system message (read-only instructions, then working context, then the
recursive summary), then the queue, append-only between flushes (each payload
is rendered once, when it joins). The system message changes only at a flush,
which rewrites the prompt from the summary on anyway: a working-context edit
the model makes is in the queue at once (its call and result), and the
system message takes the new text at the next flush (`stage_working_context`).
Functions few messages need are offered on demand (`more_tools`): once a
call that asks for them is in the queue, until a flush evicts it. The
memory status (counts, the time, memory pressure), which changes on every
call, rides at the end of the newest message only, for that request only:
the next request repeats everything before it. Nothing here is global to an
agent beyond its working context: a queue and its summary could be one per place.

A flush rewrites the prompt from the summary on, so it is rare and large:
the queue is cut in one chunk down to a low-water mark, not a few messages
at each call. An optional queue budget (MEMGPT_QUEUE_TOKENS) caps what one
call costs on a model with a very large window.

Token counts are kept per piece and cached, so checking the budget before each
call costs microseconds instead of re-tokenising the whole prompt; tests check
that the cached total never falls below a full recount.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memory.tokens import TOKENS_PER_MESSAGE, TOKENS_PER_REQUEST, TokenCounter
from memory.types import Message

log = logging.getLogger(__name__)

# BPE may merge across the joins between prompt pieces; a small allowance per
# join keeps the cached total an upper bound of a full recount.
JOIN_ALLOWANCE = 3
PRESSURE_MARKER = "[memory pressure]"
# Room for the assistant message that asked for a page of search results and the
# result's JSON wrapper; and the least a page may take.
PAGE_CALL_ALLOWANCE = 160
MIN_PAGE_TOKENS = 96
# Marks the memory status in the newest message; the model's instructions name it.
STATUS_MARKER = "[memory status]"
# BPE may merge the status with the text it is attached to; an allowance keeps the count an upper bound.
STATUS_ALLOWANCE = 8

Summarizer = Callable[[str, Sequence[Message], int], Awaitable[str]]


class ContextOverflowError(Exception):
    """Even after evicting everything evictable the prompt does not fit."""


@dataclass(slots=True)
class QueueEntry:
    message: Message
    payload: dict[str, Any]
    tokens: int


@dataclass(slots=True)
class Eviction:
    evicted: list[Message]
    new_start_seq: int
    summary: str
    summarized_by_llm: bool


class QueueManager:
    def __init__(
        self,
        counter: TokenCounter,
        instructions: str,
        tools: Sequence[dict[str, Any]],
        context_window: int,
        *,
        warning_threshold: float = 0.7,
        flush_threshold: float = 1.0,
        evict_fraction: float = 0.5,
        response_reserve: int = 512,
        max_item_tokens: int = 0,
        queue_tokens: int = 0,
        more_tools: Sequence[dict[str, Any]] = (),
        more_tools_after: frozenset[str] = frozenset(),
    ) -> None:
        self.counter = counter
        self.instructions = instructions
        self.tools = list(tools)
        self.context_window = context_window
        self.evict_fraction = evict_fraction
        self.flush_threshold = flush_threshold
        self.warning_threshold = warning_threshold
        self.configured_reserve = response_reserve
        self._max_item_setting = max_item_tokens
        self._fitted = (context_window, 1.0)
        self._set_limits(context_window, 1.0)
        # MEMGPT_QUEUE_TOKENS: the queue may hold at most this many tokens (0:
        # as many as the window leaves), so a message costs a bounded prompt
        # even on a model with a very large window.
        self.queue_cap = max(0, queue_tokens)
        self._base_fixed_tokens = (
            TOKENS_PER_REQUEST
            + TOKENS_PER_MESSAGE
            + counter.count("system")
            + counter.count(instructions)
            + counter.count_tools(self.tools)
        )
        # Offered beside `tools` while the queue holds a result of a function named in
        # `more_tools_after` (the loader, or one of them called directly).
        self.more_tools = list(more_tools)
        self.more_tools_after = more_tools_after
        self._more_tools_tokens = (
            counter.count_tools(self.tools + self.more_tools) - counter.count_tools(self.tools) if more_tools else 0
        )
        self._asked_for_more = 0  # such results in the queue
        self.header_tokens = counter.count(
            "## Working context ## Summary of earlier conversation (first item of your queue) (none yet)"
        )
        self.entries: list[QueueEntry] = []
        self.queue_tokens = 0
        self.summary = ""
        self.summary_tokens = 0
        self.working_context = ""  # as the system message shows it
        self.working_context_tokens = 0  # of that or of the staged text, whichever is larger
        self.staged_working_context: str | None = None  # an edit's text, shown from the next flush
        self.warned = False
        self._last_status = ("", 0)
        # Messages from this seq on (the current event's) leave only if nothing else can.
        self.protected_seq: int | None = None

    def _set_limits(self, window: int, ratio: float) -> None:
        # `window` and the reserve are the server's tokens; our counts are
        # `ratio` times fewer, so the limits (in our tokens) shrink by it.
        self.window = window
        self.response_reserve = self.configured_reserve
        if window < self.context_window:  # as the default reserve: an eighth of a small window
            self.response_reserve = min(self.configured_reserve, max(64, window // 8))
        self.flush_limit = int((int(window * self.flush_threshold) - self.response_reserve) / ratio)
        self.warning_limit = int((int(window * self.warning_threshold) - self.response_reserve) / ratio)
        # A single queue item may take at most this share of the window in the
        # prompt; a longer one is shown shortened (it stays whole in recall).
        # Configurable (MEMGPT_MAX_MESSAGE_TOKENS), but never over half the
        # window: the newest item is never evicted, so it must leave room.
        automatic = self.flush_limit // 4
        self.max_item_tokens = max(64, min(self._max_item_setting or automatic, self.flush_limit // 2))

    def answer_room(self, prompt_tokens: int) -> int:
        """Tokens an answer may take beside a prompt of `prompt_tokens` (ours, a
        recount): what the server's window leaves, with 3% slack for the ratio,
        which was learned against our cached upper bounds."""
        ratio = self._fitted[1]
        return int(self.window * self.flush_threshold - prompt_tokens * ratio * 1.03)

    def fit_server(self, context_limit: int, ratio: float) -> None:
        """The server's word wins over ours: its context limit (0: unknown, ours
        holds) when smaller than the configured window, and its token count,
        `ratio` times ours (its tokenizer and chat template): the prompt is kept
        that much smaller. Cheap when nothing changed (called before every step)."""
        window = min(self.context_window, context_limit) if context_limit > 0 else self.context_window
        ratio = max(1.0, ratio)
        if (window, ratio) != self._fitted:
            self._fitted = (window, ratio)
            self._set_limits(window, ratio)

    # -- state ------------------------------------------------------------
    @property
    def offered_tools(self) -> list[dict[str, Any]]:
        """The function schemas this queue's requests carry."""
        return self.tools + self.more_tools if self._asked_for_more else self.tools

    @property
    def fixed_tokens(self) -> int:
        """The instructions and the offered schemas."""
        return self._base_fixed_tokens + (self._more_tools_tokens if self._asked_for_more else 0)

    def load(self, summary: str, messages: Sequence[Message], working_context: str) -> None:
        self.set_summary(summary)
        self.set_working_context(working_context)
        self.entries, self.queue_tokens, self._asked_for_more = [], 0, 0
        self.append(*messages)
        self.warned = any(PRESSURE_MARKER in (entry.message.content or "") for entry in self.entries)

    def set_summary(self, summary: str) -> None:
        self.summary = summary
        self.summary_tokens = self.counter.count(summary)

    def set_working_context(self, rendered: str) -> None:
        """Show `rendered` in the system message now (a load, a reload)."""
        self.working_context, self.staged_working_context = rendered, None
        self.working_context_tokens = self.counter.count(rendered)

    def stage_working_context(self, rendered: str) -> None:
        """Working context as the model's edit left it: the model reads the edit
        in the queue (its call and result), so the system message, and with it
        the whole cached prefix, stays as it is until the next flush. Counted at
        the larger of the two texts meanwhile: the flush must leave room for it."""
        if rendered == self.working_context:
            self.set_working_context(rendered)
            return
        self.staged_working_context = rendered
        self.working_context_tokens = max(self.counter.count(self.working_context), self.counter.count(rendered))

    def append(self, *messages: Message) -> None:
        for message in messages:
            payload = payload_of(message)
            tokens = self.counter.count_message(payload)
            if tokens > self.max_item_tokens:
                payload, tokens = self._shortened(payload, tokens)
            self.entries.append(QueueEntry(message, payload, tokens))
            self.queue_tokens += tokens
            self._asked_for_more += self._asks_for_more(message)

    def _asks_for_more(self, message: Message) -> bool:
        return message.role == "tool" and message.name in self.more_tools_after

    def _shortened(self, payload: dict[str, Any], tokens: int) -> tuple[dict[str, Any], int]:
        content = payload.get("content") or ""
        overhead = tokens - self.counter.count(content)
        keep = max(16, self.max_item_tokens - overhead - 40)
        note = (
            f"\n[... shortened here: the full text ({tokens} tokens) is in recall storage; "
            "use conversation_search to read it]"
        )
        shortened = dict(payload, content=self.counter.truncate(content, keep) + note)
        return shortened, self.counter.count_message(shortened)

    @property
    def start_seq(self) -> int | None:
        return self.entries[0].message.seq if self.entries else None

    # -- prompt -----------------------------------------------------------
    def system_text(self) -> str:
        parts = [self.instructions, "## Working context", self.working_context]
        parts += ["## Summary of earlier conversation (first item of your queue)", self.summary or "(none yet)"]
        return "\n\n".join(parts)

    def compile(self, status_line: str) -> list[dict[str, Any]]:
        """The request's messages, the memory status in the newest one. Between
        flushes, the previous call's messages (its newest without the status)
        are the start of this call's."""
        payloads = [entry.payload for entry in self.entries]
        if payloads and status_line:
            payloads[-1] = with_status(payloads[-1], status_line)
        elif not payloads:
            payloads.append({"role": "user", "content": f"{STATUS_MARKER} {status_line}"})
        return [{"role": "system", "content": self.system_text()}, *payloads]

    def total_tokens(self, status_line: str) -> int:
        return self.base_tokens() + self.status_tokens(status_line)

    def base_tokens(self) -> int:
        """The prompt without its status message."""
        return (
            self.fixed_tokens
            + self.header_tokens
            + self.working_context_tokens
            + self.summary_tokens
            + 6 * JOIN_ALLOWANCE
            + self.queue_tokens
        )

    def status_tokens(self, status_line: str) -> int:
        # The status line is checked several times per step; count it once.
        if status_line != self._last_status[0]:
            tokens = self.counter.count(f"{STATUS_MARKER} {status_line}") + STATUS_ALLOWANCE
            # Without a queue the status is a message of its own.
            self._last_status = (status_line, tokens + TOKENS_PER_MESSAGE + self.counter.count("user"))
        return self._last_status[1]

    def pressure(self) -> float:
        """How full memory is, 0..1: of the window, or of the queue budget if that binds first."""
        used = self.base_tokens() / max(1, self.flush_limit)
        return max(used, self.queue_tokens / self.queue_cap) if self.queue_cap else used

    def needs_warning(self, status_line: str) -> bool:
        if self.warned:
            return False
        if self.queue_cap and self.queue_tokens >= self.queue_cap * self.warning_threshold:
            return True
        return self.total_tokens(status_line) >= self.warning_limit

    def needs_flush(self, status_line: str) -> bool:
        over_budget = bool(self.queue_cap) and self.queue_tokens > self.queue_cap
        return over_budget or self.total_tokens(status_line) > self.flush_limit

    # -- eviction ---------------------------------------------------------
    def summary_budget(self) -> int:
        return max(64, self.window // 10)

    def page_budget(self, status_line: str) -> int:
        """Tokens a page of search results may take. Eviction runs before every
        call and can cut the queue back to this step's call and its result, so
        the page must fit next to the parts that cannot be evicted: the fixed
        prompt, working context, status line, the summary at its full budget,
        and the call that asked for the page with the result's wrapper."""
        pinned = (
            self.fixed_tokens
            + self.header_tokens
            + self.working_context_tokens
            + self.status_tokens(status_line)
            + self.summary_budget()
            + PAGE_CALL_ALLOWANCE
        )
        cap = self.flush_limit // 5
        return max(MIN_PAGE_TOKENS, min(cap, self.flush_limit - pinned))

    def queue_room(self, status_line: str) -> int:
        """Tokens the queue may fill before a flush: what the window leaves
        beside everything else (the summary at its full budget), or the queue
        budget if that is smaller."""
        beside = self.total_tokens(status_line) - self.queue_tokens - self.summary_tokens + self.summary_budget()
        room = self.flush_limit - beside
        return min(room, self.queue_cap) if self.queue_cap else room

    def _cut_index(self, status_line: str) -> int:
        """How many leading entries to evict: the queue goes down to its
        low-water mark, (1 - evict_fraction) of the room it may fill, in one
        chunk (the prefix from the summary on is rewritten once, then stays
        warm in the provider's cache until the next flush). Never leaving a
        tool result without the call before it, never evicting the newest item."""
        valid = [i for i, e in enumerate(self.entries) if e.message.role != "tool" and i > 0]
        if not valid:
            raise ContextOverflowError("the queue has no point where it can be cut")
        # The current event's messages stay when a cut before them exists: a flush
        # that a pressure alert set off must not take the message the model is to answer.
        protected = self.protected_seq
        if protected is not None:
            before = [i for i in valid if (self.entries[i].message.seq or 0) <= protected]
            valid = before or valid
        # The low-water mark is within the room, so reaching it also makes the
        # prompt fit the window with the summary at its full budget.
        low_water = max(0, int(self.queue_room(status_line) * (1 - self.evict_fraction)))
        target = max(1, self.queue_tokens - low_water)
        prefix = [0]
        for entry in self.entries:
            prefix.append(prefix[-1] + entry.tokens)
        for index in valid:
            evicted = prefix[index]
            if evicted >= target:
                return index
        return valid[-1]

    async def evict(self, status_line: str, summarize: Summarizer) -> Eviction:
        """Choose what leaves and write the new recursive summary. The caller
        stores the result, then calls `apply` (so a failed write changes nothing)."""
        cut = self._cut_index(status_line)
        evicted = [entry.message for entry in self.entries[:cut]]
        budget = self.summary_budget()
        by_llm = True
        try:
            summary = await summarize(self.summary, evicted, budget)
            if not summary.strip():
                raise ValueError("the summarizer returned an empty summary")
        except Exception as error:
            log.warning("summary by the LLM failed (%s); evicting with a plain truncated summary", error)
            summary, by_llm = self.plain_summary(evicted), False
        if self.counter.count(summary) > budget:
            log.info("summary over its budget of %d tokens; truncated", budget)
            summary = self.counter.truncate(summary, budget)
        return Eviction(evicted, self.entries[cut].message.seq, summary, by_llm)

    def apply(self, eviction: Eviction) -> None:
        cut = len(eviction.evicted)
        self.queue_tokens -= sum(entry.tokens for entry in self.entries[:cut])
        self._asked_for_more -= sum(self._asks_for_more(entry.message) for entry in self.entries[:cut])
        del self.entries[:cut]
        self.set_summary(eviction.summary)
        if self.staged_working_context is not None:  # the system message is rewritten now anyway
            self.set_working_context(self.staged_working_context)
        self.warned = False

    def summary_prompt(self, evicted: Sequence[Message], ask: str) -> list[dict[str, Any]] | None:
        """A summarizer request that starts the way this queue's requests do:
        the system message (with the current summary), the evicted messages
        exactly as they were sent, then `ask`. That prefix is what the
        provider cached for the last step, so a summary costs about a quarter
        of a fresh prompt of the same size. None unless `evicted` is the head
        of the queue."""
        head = self.entries[: len(evicted)]
        if (
            not evicted
            or len(head) < len(evicted)
            or any(e.message is not m for e, m in zip(head, evicted, strict=True))
        ):
            return None
        payloads = [entry.payload for entry in head]
        return [{"role": "system", "content": self.system_text()}, *payloads, {"role": "user", "content": ask}]

    def plain_summary(self, evicted: Sequence[Message]) -> str:
        transcript = render_transcript(evicted)
        text = f"{self.summary}\n[Later messages, not summarized (summarizer unavailable)]:\n{transcript}"
        return self.counter.truncate(text.strip(), self.summary_budget())

    def fits_or_raise(self, status_line: str) -> int:
        total = self.total_tokens(status_line)
        if total > self.flush_limit:
            raise ContextOverflowError(
                f"prompt needs {total} tokens but only {self.flush_limit} are available "
                f"(window {self.window}); shrink working context limits or raise MEMGPT_CONTEXT_WINDOW"
            )
        return total


def payload_of(message: Message) -> dict[str, Any]:
    """A message as the requests carry it, rendered once, when it joins the queue. Content
    is always a string, "" beside tool calls: the shape every server accepts
    (bot/llm/shape.py), so a request needs no copy of it. `name` stays out (see Message)."""
    content = message.shown if message.shown is not None else message.content
    payload: dict[str, Any] = {"role": message.role, "content": content or ""}
    if message.tool_calls:
        payload["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        payload["tool_call_id"] = message.tool_call_id
    return payload


def with_status(payload: dict[str, Any], status_line: str) -> dict[str, Any]:
    """A copy of the newest message carrying the memory status: after a
    message's text (what the person said, an alert), or as a `memory_status`
    field of a function result, which stays valid JSON. Attached for one
    request only; the queue keeps the message as it was, so the next request
    repeats its text from the first token (a cached prefix to its end)."""
    content = payload.get("content")
    if not isinstance(content, str):
        content = ""
    if payload.get("role") == "tool" and content.startswith("{") and content.endswith("}"):
        field = json.dumps(status_line, ensure_ascii=False)
        return {**payload, "content": f'{content[:-1]}, "memory_status": {field}}}'}
    return {**payload, "content": f"{content}\n{STATUS_MARKER} {status_line}"}


def render_transcript(messages: Sequence[Message]) -> str:
    lines = []
    for message in messages:
        stamp = message.created_at.strftime("%Y-%m-%d %H:%M")
        if message.tool_calls:
            calls = "; ".join(
                f"{c.get('function', {}).get('name')}({c.get('function', {}).get('arguments', '')})"
                for c in message.tool_calls
            )
            thought = f" (thinking: {message.content})" if message.content else ""
            lines.append(f"[{stamp}] agent called {calls}{thought}")
        elif message.role == "tool":
            lines.append(f"[{stamp}] function result: {message.content}")
        else:
            lines.append(f"[{stamp}] {message.role}: {message.content}")
    return "\n".join(lines)
