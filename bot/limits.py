"""Abuse and cost control: a per-user message rate limit and a daily LLM token
budget, counted in the store so that they hold across bot processes.

- **Rate**: at most MEMGPT_RATE_LIMIT_PER_MINUTE user messages (and file
  uploads) in any 60 seconds. Only what a person sends counts: check-ins,
  joins and system alerts never do.
- **Budget**: at most MEMGPT_DAILY_TOKEN_BUDGET tokens of LLM calls per UTC
  day, counted locally with the model's tokenizer (the whole prompt with the
  function schemas, plus the completion: AgentCalls.complete in bot/agent_calls.py), never taken from
  the server's token counts. A prompt token the server says it served from
  its prompt cache counts at MEMGPT_CACHED_TOKEN_WEIGHT (default 1: in full).
  An event that starts under budget runs to its end, so a user can overshoot
  by one event's steps at most. Beside the charged amount, each event records
  its prompt, cached and completion tokens, which `limits show` reports per day.
- Users in MEMGPT_UNLIMITED_USERS, or exempted with `memgpt-bot limits
  exempt USER`, are never held (their usage is still counted, for `limits show`).

Over a limit, an event reaches no LLM, but nothing the person said is lost:
their message goes into recall storage (and the queue, marked as held, so the
model sees it on the next turn). They get a friendly notice saying when they
can write again, once per episode: once per burst over the rate (until a
message gets through again), once per UTC day over the budget. Uploaded files
are not read while over a limit (reading costs CPU; the notice asks to send
them again). A check-in tick for a user over budget is skipped with a log line.

Counters are rows/documents per hit (UsageStore in memory/roles.py says why); hits older
than two days are swept now and then.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from bot.agent import Agent, EventResult
from bot.config import Settings
from bot.events import Event, FileUploaded, ScheduledTick, UserMessage
from bot.llm import TokenUsage
from memory.roles import UsageStore
from memory.store import StoreError
from memory.types import UsageTally, utc_now

log = logging.getLogger(__name__)

MESSAGE = "message"  # one user message (or upload) let through
TOKENS = "tokens"  # the tokens of one event's LLM calls, as charged to the budget
# ... and their parts, for `limits show` (not charged: TOKENS is)
PROMPT_TOKENS, CACHED_TOKENS, COMPLETION_TOKENS = "tokens:prompt", "tokens:cached", "tokens:completion"
RATE_NOTICE = "notice:rate"  # the person was told they are over the rate
BUDGET_NOTICE = "notice:budget"  # ... over today's budget
RATE_WINDOW = timedelta(minutes=1)
KEEP_HITS = timedelta(days=2)  # longer than any window: a day of tokens, a minute of messages
PRUNE_EVERY = timedelta(hours=1)
USER_EVENTS = (UserMessage, FileUploaded)  # what counts toward the rate

HELD_NOTE = {
    "rate": "[held: sent over the message rate limit; no answer was given, and they were told to slow down]",
    "budget": "[held: sent after today's token budget was used up; no answer was given, and they were told "
    "when it resets]",
}


@dataclass(slots=True)
class DayTokens:
    """One UTC day's LLM tokens: charged to the budget, and their parts."""

    day: datetime
    charged: int
    prompt: int
    cached: int
    completion: int


@dataclass(slots=True)
class Usage:
    """Where one user stands, for `memgpt-bot limits show`."""

    key: str
    messages_last_minute: int
    rate_limit: int  # 0: off
    tokens_today: int
    daily_budget: int  # 0: off
    exempt_by_admin: bool
    exempt_by_env: bool
    budget_resets_at: datetime
    days: list[DayTokens]  # today first, then yesterday (older counters are swept)

    @property
    def exempt(self) -> bool:
        return self.exempt_by_admin or self.exempt_by_env


@dataclass(slots=True)
class _Seen:
    """A key's windows as last read, plus what this process counted since: upper bounds while
    `agent` is the loaded copy (the door reloads it when another process may have worked on
    the agent, bot/door.py; deletions, such as a `limits reset` elsewhere, only lower the truth)."""

    agent: weakref.ref[Agent]
    day: datetime  # the UTC day whose tokens were read
    tokens: int
    messages: int  # message hits read in the rate window...
    newest: datetime | None  # ...and the newest of them
    admitted: list[datetime] = field(default_factory=list)  # messages counted here since

    def messages_since(self, since: datetime) -> int:
        self.admitted = [at for at in self.admitted if at >= since]
        return len(self.admitted) + (self.messages if self.newest and self.newest >= since else 0)


def start_of_day(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def window_start(now: datetime) -> datetime:
    """The oldest hit still in the rate window: one exactly a minute old is out,
    so a person told "until 09:01:00" can write at 09:01:00."""
    return now - RATE_WINDOW + timedelta(microseconds=1)


def humanize_wait(delta: timedelta) -> str:
    seconds = max(1, int(delta.total_seconds() + 0.999))
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = (seconds + 59) // 60
    if minutes < 60:
        return f"about {minutes} minute{'s' if minutes != 1 else ''}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class UsageLimits:
    def __init__(
        self,
        store: UsageStore,
        settings: Settings,
        clock: Callable[[], datetime] = utc_now,
        *,
        remember: bool = False,
    ) -> None:
        self.store = store
        self.rate_limit = max(0, settings.rate_limit_per_minute)
        self.daily_budget = max(0, settings.daily_token_budget)
        self.unlimited = frozenset(settings.unlimited_users)
        self.clock = clock  # injectable: tests move time instead of sleeping
        self._next_prune: datetime | None = None
        # Admitted user messages whose hit is written with the event's tokens,
        # when it ends: one write per event instead of two. Events of one user
        # run one at a time (lease and lane), so the next admission sees it.
        self._admitted: dict[str, datetime] = {}
        # `remember`: leases tell when another process served an agent (its copy is reloaded
        # then), so the windows read at one admission serve the next ones while they say
        # "under". Without leases one process is assumed, but other runtimes on the same
        # SQLite file must still be seen: every admission reads.
        self._seen: dict[str, _Seen] | None = {} if remember else None

    @property
    def enabled(self) -> bool:
        return self.rate_limit > 0 or self.daily_budget > 0

    # -- the runtime's calls ------------------------------------------------
    async def admit(self, agent: Agent, event: Event) -> EventResult | None:
        """None: the event goes ahead (a user message counts toward the rate).
        Otherwise the user is over a limit: the event was kept in recall
        storage without any LLM call, and the result holds the notice, if one
        is due. Called with the agent's lease and lock held, so one user's
        events are checked one at a time, whichever process runs them."""
        if not self.enabled:
            return None
        return await self._admit(agent, event)

    async def metered(self, agent: Agent, event: Event) -> EventResult:
        """`agent.handle(event)`, with the tokens its LLM calls spent charged
        to the user, also when it fails half-way: written beside the record of
        its last step (no LLM call comes after that), else once it stopped."""
        before, parts_before = agent.tokens_used, agent.usage.copy()
        charged = False

        async def charge() -> None:
            nonlocal charged
            if not charged:
                charged = True
                await self.charge(event.agent_key, agent.tokens_used - before, agent.usage.since(parts_before))

        try:
            result = await agent.handle(event, ending=charge)
        finally:
            await charge()
        result.tokens_used = agent.tokens_used - before
        return result

    async def charge(self, key: str, tokens: int, parts: TokenUsage | None = None) -> None:
        admitted = self._admitted.pop(key, None)
        hits = {MESSAGE: 1} if admitted is not None else {}
        # Counted with the budget off too: `limits show` reports usage either way.
        if tokens > 0:
            hits[TOKENS] = tokens
            if parts is not None:
                counts = {PROMPT_TOKENS: parts.prompt, CACHED_TOKENS: parts.cached, COMPLETION_TOKENS: parts.completion}
                hits.update((kind, amount) for kind, amount in counts.items() if amount > 0)
        if not hits:
            return
        seen = self._seen.get(key) if self._seen is not None else None
        if seen is not None:  # counted whether or not the write lands: an upper bound either way
            seen.tokens += hits.get(TOKENS, 0)
            seen.admitted += [admitted] if admitted is not None else []
        try:
            # One write for the event, at its admission (the message's time in the rate window).
            await self.store.record_usage(key, hits, admitted or self.clock())
        except StoreError as error:
            # The answer is out already; losing one event's count is better than losing the answer.
            log.error("could not count %d tokens for %s: %s", tokens, key, error)

    async def forget(self, key: str) -> None:
        """Delete the user's counters and any exemption stored for them: a
        forgotten user leaves no row behind (MEMGPT_UNLIMITED_USERS, being
        configuration, is untouched)."""
        await self.reset(key)
        await self.set_exempt(key, False)

    # -- admin ------------------------------------------------------------
    async def usage(self, key: str) -> Usage:
        now = self.clock()
        today = start_of_day(now)
        days = [await self._day_tokens(key, today, None), await self._day_tokens(key, today - timedelta(days=1), today)]
        return Usage(
            key=key,
            messages_last_minute=(await self.store.usage_since(key, MESSAGE, window_start(now))).count,
            rate_limit=self.rate_limit,
            tokens_today=(await self.store.usage_since(key, TOKENS, start_of_day(now))).amount,
            daily_budget=self.daily_budget,
            exempt_by_admin=await self.store.usage_exempt(key),
            exempt_by_env=key in self.unlimited,
            budget_resets_at=today + timedelta(days=1),
            days=days,
        )

    async def _day_tokens(self, key: str, start: datetime, end: datetime | None) -> DayTokens:
        """Token sums from `start` to `end` (None: now), by difference of two windows."""

        async def between(kind: str) -> int:
            total = (await self.store.usage_since(key, kind, start)).amount
            return total - (await self.store.usage_since(key, kind, end)).amount if end else total

        return DayTokens(
            day=start,
            charged=await between(TOKENS),
            prompt=await between(PROMPT_TOKENS),
            cached=await between(CACHED_TOKENS),
            completion=await between(COMPLETION_TOKENS),
        )

    async def set_exempt(self, key: str, exempt: bool) -> bool:
        return await self.store.set_usage_exempt(key, exempt, self.clock())

    async def reset(self, key: str) -> int:
        """Clear the user's counters: they may write and spend from zero again."""
        if self._seen is not None:
            self._seen.pop(key, None)
        return await self.store.delete_usage(key)

    # -- inside -------------------------------------------------------------
    async def _admit(self, agent: Agent, event: Event) -> EventResult | None:
        store, key, now = self.store, event.agent_key, self.clock()
        await self._prune(now)
        rated = isinstance(event, USER_EVENTS) and self.rate_limit > 0
        midnight = start_of_day(now)
        # What the checks read, in one round trip: today's tokens, the last minute's messages.
        windows = [(TOKENS, midnight)] if self.daily_budget else []
        windows += [(MESSAGE, window_start(now))] if self.rate_limit else []
        if key in self.unlimited or self._under(agent, key, midnight, window_start(now)):
            windows = []
        tallies = await self._read(agent, key, windows, midnight) if windows else []
        over_budget = bool(self.daily_budget and tallies and tallies[0].amount >= self.daily_budget)
        recent = tallies[-1] if rated and tallies else None
        over_rate = bool(recent and recent.count >= self.rate_limit and recent.oldest and recent.newest)
        # An admin's exemption matters only over a limit: read then, not on every event.
        if (over_budget or over_rate) and await store.usage_exempt(key):
            over_budget = over_rate = False
        if over_budget:
            told = (await store.usage_since(key, BUDGET_NOTICE, midnight)).count > 0
            return await self._hold(agent, event, "budget", midnight + timedelta(days=1), now, told)
        if not rated:
            return None
        if over_rate and recent and recent.oldest and recent.newest:
            # Told already if a notice went out since the last message that got through.
            told = (await store.usage_since(key, RATE_NOTICE, recent.newest)).count > 0
            return await self._hold(agent, event, "rate", recent.oldest + RATE_WINDOW, now, told)
        self._admitted[key] = now  # counted by charge(), with the event's tokens
        return None

    def _under(self, agent: Agent, key: str, midnight: datetime, since: datetime) -> bool:
        """Under both limits by what this process saw since it last read them (see _Seen)."""
        seen = self._seen.get(key) if self._seen is not None else None
        if seen is None or seen.agent() is not agent or seen.day != midnight:
            return False
        return (not self.daily_budget or seen.tokens < self.daily_budget) and (
            not self.rate_limit or seen.messages_since(since) < self.rate_limit
        )

    async def _read(
        self, agent: Agent, key: str, windows: list[tuple[str, datetime]], midnight: datetime
    ) -> list[UsageTally]:
        tallies = await self.store.usage_windows(key, windows)
        if self._seen is not None:
            tokens = tallies[0].amount if self.daily_budget else 0
            recent = tallies[-1] if self.rate_limit else UsageTally(0, 0, None, None)
            self._seen[key] = _Seen(weakref.ref(agent), midnight, tokens, recent.count, recent.newest)
        return tallies

    async def _hold(
        self, agent: Agent, event: Event, reason: str, until: datetime, now: datetime, told: bool
    ) -> EventResult:
        key = event.agent_key
        if isinstance(event, ScheduledTick):
            log.info("check-in for %s skipped: over the daily token budget until %s", key, until.isoformat())
            return EventResult(held=reason)
        log.info("event %s of %s held: over the %s limit until %s", event.event_id, key, reason, until.isoformat())
        if isinstance(event, FileUploaded):
            event.load_error = "it was sent while over the usage limit, so it was not read (ask them to send it again)"
        await agent.record_event_message(event, f"{event.render()}\n{HELD_NOTE[reason]}")
        result = EventResult(held=reason)
        if told or not isinstance(event, USER_EVENTS):
            return result  # once per episode, and only to someone who wrote
        await self.store.record_usage(key, {RATE_NOTICE if reason == "rate" else BUDGET_NOTICE: 1}, now)
        text = self._rate_notice(until, now) if reason == "rate" else self._budget_notice(until, now)
        result.replies.append(event.reply(text))
        return result

    def _rate_notice(self, until: datetime, now: datetime) -> str:
        until = max(until, now + timedelta(seconds=1))
        return (
            f"Whoa, that's a lot at once! I take up to {self.rate_limit} messages a minute, so I'm pausing "
            f"until {until:%H:%M:%S} UTC (in {humanize_wait(until - now)}). I'm keeping everything you write "
            "meanwhile and will see it then; files sent before then aren't read, so please send those again."
        )

    def _budget_notice(self, until: datetime, now: datetime) -> str:
        return (
            f"We've reached today's conversation budget ({self.daily_budget:,} tokens), so I can't answer "
            f"until it resets at midnight UTC (in {humanize_wait(until - now)}). I'm keeping everything you "
            "write meanwhile and will see it then; files sent before then aren't read, so please send those again."
        )

    async def _prune(self, now: datetime) -> None:
        if self._next_prune is not None and now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY
        try:
            removed = await self.store.prune_usage(now - KEEP_HITS)
        except StoreError as error:  # housekeeping: the next hour tries again
            log.warning("could not sweep old usage counters: %s", error)
            return
        if removed:
            log.info("swept %d usage counters older than %s", removed, KEEP_HITS)
