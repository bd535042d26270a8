"""Prometheus metrics any layer can record, and one registry to serve them.

Module-level metrics (prometheus-client), so a layer records with one call and
needs no wiring: `metrics.EVENTS_RECEIVED.labels("slack").inc()`, or the
helpers below. `memgpt-bot run` serves them at /metrics, beside /healthz, when
MEMGPT_METRICS_PORT is set (cli/health.py). Label values are few and fixed
(platforms, outcomes, error kinds), never user ids: one series per value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from bot.llm.types import TokenUsage

# Our own registry: nothing of the process's default collectors or of other
# libraries, and a test can read exact values.
REGISTRY = CollectorRegistry(auto_describe=True)

# Seconds: a reply is usually 1-20 s (one or a few LLM calls), a check-in can take longer.
_SECONDS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160)

EVENTS_RECEIVED = Counter(
    "memgpt_events_received",
    "Platform events recorded in the inbox (repeats not counted)",
    ["platform"],
    registry=REGISTRY,
)
EVENTS_HANDLED = Counter(
    "memgpt_events_handled",
    "Events run through an agent, by outcome (replied, silent, error)",
    ["platform", "outcome"],
    registry=REGISTRY,
)
EVENT_SECONDS = Histogram(
    "memgpt_event_reply_seconds",
    "From an event's arrival to its replies being ready",
    ["platform"],
    buckets=_SECONDS,
    registry=REGISTRY,
)
LLM_CALLS = Counter("memgpt_llm_calls", "LLM calls, by outcome (ok, error)", ["outcome"], registry=REGISTRY)
LLM_SECONDS = Histogram(
    "memgpt_llm_call_seconds", "One LLM call, retries included", buckets=_SECONDS, registry=REGISTRY
)
LLM_TOKENS = Counter(
    "memgpt_llm_tokens",
    "Tokens the LLM server reported: prompt, cached (part of prompt), completion",
    ["kind"],
    registry=REGISTRY,
)
ERRORS = Counter("memgpt_errors", "Errors by kind (llm, store, delivery, internal)", ["kind"], registry=REGISTRY)
PENDING_INBOX = Gauge(
    "memgpt_inbox_pending", "Inbound events recorded in the inbox but not finished", ["platform"], registry=REGISTRY
)
PENDING_OUTBOX = Gauge("memgpt_outbox_pending", "Replies not yet confirmed sent", ["platform"], registry=REGISTRY)
AGENTS_LOADED = Gauge("memgpt_agents_in_memory", "Agents loaded in this process", registry=REGISTRY)


def record_llm_call(seconds: float, usage: TokenUsage | None) -> None:
    """One LLM call (with the SDK's retries): answered, with the tokens of its
    answer as the server counted them (0: not reported), or failed (None)."""
    LLM_CALLS.labels("ok" if usage is not None else "error").inc()
    LLM_SECONDS.observe(seconds)
    if usage is None:
        ERRORS.labels("llm").inc()
        return
    LLM_TOKENS.labels("prompt").inc(usage.prompt)
    LLM_TOKENS.labels("completion").inc(usage.completion)
    LLM_TOKENS.labels("cached").inc(usage.cached)


def record_event(platform: str, seconds: float, outcome: str) -> None:
    """One event through an agent: `outcome` is replied, silent or error."""
    EVENTS_HANDLED.labels(platform, outcome).inc()
    EVENT_SECONDS.labels(platform).observe(seconds)
    if outcome == "error":
        ERRORS.labels("internal").inc()
