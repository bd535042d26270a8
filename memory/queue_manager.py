"""The FIFO queue and its manager: what the model sees, and what must leave.

The prompt is compiled fresh for every call as one system message (read-only
instructions, working context, memory status, the recursive summary) followed
by the queue. Token counts are kept per piece and cached, so checking the
budget before each call costs microseconds instead of re-tokenising the whole
prompt; tests check that the cached total never falls below a full recount.
"""

from __future__ import annotations

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
    ) -> None:
        self.counter = counter
        self.instructions = instructions
        self.tools = list(tools)
        self.context_window = context_window
        self.evict_fraction = evict_fraction
        self.flush_limit = int(context_window * flush_threshold) - response_reserve
        self.warning_limit = int(context_window * warning_threshold) - response_reserve
        # A single queue item may take at most this share of the window in the
        # prompt; a longer one is shown shortened (it stays whole in recall).
        # Configurable (MEMGPT_MAX_MESSAGE_TOKENS), but never over half the
        # window: the newest item is never evicted, so it must leave room.
        automatic = self.flush_limit // 4
        self.max_item_tokens = max(64, min(max_item_tokens or automatic, self.flush_limit // 2))
        self.fixed_tokens = (
            TOKENS_PER_REQUEST
            + TOKENS_PER_MESSAGE
            + counter.count("system")
            + counter.count(instructions)
            + counter.count_tools(self.tools)
        )
        self.header_tokens = counter.count(
            "## Working context ## Memory status "
            "## Summary of earlier conversation (first item of your queue) (none yet)"
        )
        self.entries: list[QueueEntry] = []
        self.queue_tokens = 0
        self.summary = ""
        self.summary_tokens = 0
        self.working_context = ""
        self.working_context_tokens = 0
        self.warned = False
        self._last_status = ("", 0)

    # -- state ------------------------------------------------------------
    def load(self, summary: str, messages: Sequence[Message], working_context: str) -> None:
        self.set_summary(summary)
        self.set_working_context(working_context)
        self.entries, self.queue_tokens = [], 0
        for message in messages:
            self.append(message)
        self.warned = any(PRESSURE_MARKER in (entry.message.content or "") for entry in self.entries)

    def set_summary(self, summary: str) -> None:
        self.summary = summary
        self.summary_tokens = self.counter.count(summary)

    def set_working_context(self, rendered: str) -> None:
        self.working_context = rendered
        self.working_context_tokens = self.counter.count(rendered)

    def append(self, message: Message) -> None:
        payload = message.to_openai()
        tokens = self.counter.count_message(payload)
        if tokens > self.max_item_tokens:
            payload, tokens = self._shortened(payload, tokens)
        self.entries.append(QueueEntry(message, payload, tokens))
        self.queue_tokens += tokens

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
    def system_text(self, status_line: str) -> str:
        parts = [self.instructions, "## Working context", self.working_context, "## Memory status", status_line]
        parts += ["## Summary of earlier conversation (first item of your queue)", self.summary or "(none yet)"]
        return "\n\n".join(parts)

    def compile(self, status_line: str) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_text(status_line)}] + [e.payload for e in self.entries]

    def total_tokens(self, status_line: str) -> int:
        return (
            self.fixed_tokens
            + self.header_tokens
            + self.working_context_tokens
            + self._status_tokens(status_line)
            + self.summary_tokens
            + 6 * JOIN_ALLOWANCE
            + self.queue_tokens
        )

    def _status_tokens(self, status_line: str) -> int:
        # The status line is checked several times per step; count it once.
        if status_line != self._last_status[0]:
            self._last_status = (status_line, self.counter.count(status_line))
        return self._last_status[1]

    def pressure(self, status_line: str) -> float:
        return self.total_tokens(status_line) / self.context_window

    def needs_warning(self, status_line: str) -> bool:
        return not self.warned and self.total_tokens(status_line) >= self.warning_limit

    def needs_flush(self, status_line: str) -> bool:
        return self.total_tokens(status_line) > self.flush_limit

    # -- eviction ---------------------------------------------------------
    def summary_budget(self) -> int:
        return max(64, self.context_window // 10)

    def _cut_index(self, status_line: str) -> int:
        """How many leading entries to evict: about `evict_fraction` of the
        queue's tokens, more if still over the limit, never leaving a tool
        result without the call before it, never evicting the newest item."""
        valid = [i for i, e in enumerate(self.entries) if e.message.role != "tool" and i > 0]
        if not valid:
            raise ContextOverflowError("the queue has no point where it can be cut")
        target = self.queue_tokens * self.evict_fraction
        # The summary may grow to its budget; leave room for that.
        room_needed = self.total_tokens(status_line) - self.summary_tokens + self.summary_budget() - self.flush_limit
        target = max(target, room_needed)
        evicted = 0
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
        del self.entries[:cut]
        self.set_summary(eviction.summary)
        self.warned = False

    def plain_summary(self, evicted: Sequence[Message]) -> str:
        transcript = render_transcript(evicted)
        text = f"{self.summary}\n[Later messages, not summarized (summarizer unavailable)]:\n{transcript}"
        return self.counter.truncate(text.strip(), self.summary_budget())

    def fits_or_raise(self, status_line: str) -> int:
        total = self.total_tokens(status_line)
        if total > self.flush_limit:
            raise ContextOverflowError(
                f"prompt needs {total} tokens but only {self.flush_limit} are available "
                f"(window {self.context_window}); shrink working context limits or raise MEMGPT_CONTEXT_WINDOW"
            )
        return total


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
