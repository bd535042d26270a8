"""What the bot learns about one LLM endpoint while talking to it.

One `Endpoint` per client (one base URL), shared by every agent of the process:

- parameters the server refused (sent once, then never again);
- repairs its refusals needed: messages to leave out (by fingerprint), and
  whether function calls must go as plain text (bot/llm/shape.py);
- per model, the server's own context limit when it named one, and the ratio
  between the server's prompt token count and ours (its tokenizer and chat
  template are not tiktoken): from the usage it reports on every call, and
  from its context-limit refusals. The queue manager leaves that margin.
- a cap on requests in flight (MEMGPT_LLM_CONCURRENCY): a single-slot server
  (llama-cpp-python, llama-server without --parallel) answers one at a time,
  so more only wait at the server, where a timeout cannot see them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# Ratios from small prompts are noise (a few tokens of template dominate).
MIN_TOKENS_FOR_RATIO = 200
MAX_RATIO = 4.0
# An observation above the estimate is taken at once (the next prompt must fit);
# below it, the estimate comes down slowly.
RATIO_DECAY = 0.1
# A refusal whose count is this far above every answered prompt's (once a few were
# answered) is doubted once: llama-cpp-python's function calling generates a call's
# arguments without the request's max_tokens and refuses its own follow-up prompt,
# naming its window + 1 tokens for a prompt it counted at 1.05 of ours on the answer
# before: taken as a ratio (1.24), that shrank the window below the fixed prompt.
DOUBTFUL_REFUSAL = 1.15
ANSWERS_BEFORE_DOUBT = 3


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
