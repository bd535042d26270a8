"""The settings of the feature modules that bot/config.py gathers (check-ins,
leases): here, beside nothing but their readers, so that the settings depend
on no feature and the feature modules (bot/checkins/, bot/durable/leases.py)
take their settings from below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from bot.errors import ConfigError

LeaseMode = Literal["auto", "on", "off"]
_Number = TypeVar("_Number", int, float)


@dataclass(frozen=True, slots=True)
class CheckinSettings:
    backoff_after: int = 2  # unanswered ticks before back-off starts; 0 turns it off
    max_backoff_days: int = 14  # back-off never leaves a longer gap than this
    grace_minutes: int = 30  # a tick missed by at most this much still fires (once)
    max_reminders: int = 20  # pending one-time reminders per user
    min_reminder_minutes: int = 1  # how soon a reminder may be, from now
    max_checkins: int = 10  # recurring check-ins per user
    resync_seconds: int = 30  # how often a process re-reads the shared schedules
    concurrency: int = 8  # ticks run at once per process (09:00 is popular; LLM rate limits)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CheckinSettings:
        default = cls()

        def read(name: str, attribute: str, minimum: int) -> int:
            return _env_int(env, name, getattr(default, attribute), minimum=minimum)

        values = {
            "backoff_after": read("MEMGPT_CHECKIN_BACKOFF_AFTER", "backoff_after", 0),
            "max_backoff_days": read("MEMGPT_CHECKIN_MAX_BACKOFF_DAYS", "max_backoff_days", 1),
            "grace_minutes": read("MEMGPT_CHECKIN_GRACE_MINUTES", "grace_minutes", 0),
            "max_reminders": read("MEMGPT_MAX_REMINDERS", "max_reminders", 1),
            "min_reminder_minutes": read("MEMGPT_MIN_REMINDER_MINUTES", "min_reminder_minutes", 0),
            "max_checkins": read("MEMGPT_MAX_CHECKINS", "max_checkins", 1),
            "resync_seconds": read("MEMGPT_CHECKIN_RESYNC_SECONDS", "resync_seconds", 1),
            "concurrency": read("MEMGPT_CHECKIN_CONCURRENCY", "concurrency", 1),
        }
        return cls(**values)


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    mode: LeaseMode = "auto"  # auto: on with MongoDB, off with SQLite
    # Seconds an owner lives without a renewal; renewed six times in that span,
    # so a database stalled for up to about 0.8 ttl - renew_every (19 s by
    # default) costs no lease: a stall must not stop work a process holds.
    ttl: float = 30.0
    renew_every: float = 5.0
    max_wait: float = 300.0  # seconds an event waits for its turn before giving up

    def __post_init__(self) -> None:
        if self.ttl <= 0 or not 0 < self.renew_every <= self.ttl / 2:
            raise ConfigError(
                f"need MEMGPT_LEASE_TTL > 0 and 0 < MEMGPT_LEASE_RENEW <= MEMGPT_LEASE_TTL / 2, "
                f"got {self.ttl} and {self.renew_every}"
            )
        if self.max_wait <= 0:
            raise ConfigError(f"MEMGPT_LEASE_WAIT must be positive, got {self.max_wait}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LeaseSettings:
        mode = (env.get("MEMGPT_LEASES") or "auto").strip().lower()
        if mode not in ("auto", "on", "off"):
            raise ConfigError(f"MEMGPT_LEASES must be auto, on or off, got {mode!r}")
        default = cls()
        ttl = _seconds(env, "MEMGPT_LEASE_TTL", default.ttl)
        return cls(
            mode=mode,  # type: ignore[arg-type]
            ttl=ttl,
            # The renewal period follows a changed ttl unless set too.
            renew_every=_seconds(env, "MEMGPT_LEASE_RENEW", ttl / 6),
            max_wait=_seconds(env, "MEMGPT_LEASE_WAIT", default.max_wait),
        )


def _read(env: Mapping[str, str], name: str, default: _Number, parse: Callable[[str], _Number], what: str) -> _Number:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ConfigError(f"{name} must be {what}, got {raw!r}") from None


def _env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    value = _read(env, name, default, lambda raw: int(raw.replace("_", "")), "a whole number")
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    return _read(env, name, default, float, "a number of seconds")
