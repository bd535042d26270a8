"""The Slack adapter's small parts: configuration from the environment, the
record of delivered event ids, a bounded cache, and a few helpers shared by
the adapter and its commands (per-user order: bot/durable/lanes.py)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError

PLATFORM = "slack"
REPLY_LIMIT = 3_000  # Slack truncates long texts and renders ~4,000 chars per message well
DEFAULT_MAX_UPLOAD_BYTES = 5 * 1024 * 1024

# What a Web API call may raise; none of it may crash the app.
CALL_ERRORS = (SlackApiError, aiohttp.ClientError, TimeoutError)


class SlackSetupError(RuntimeError):
    """Slack refused the configured credentials, or cannot be reached, at start-up."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True)
class SlackConfig:
    """Credentials and where to listen. Tokens are kept out of repr (and so out of logs)."""

    bot_token: str = field(repr=False)
    app_token: str | None = field(default=None, repr=False)
    signing_secret: str | None = field(default=None, repr=False)
    api_url: str | None = None
    http_host: str = "0.0.0.0"
    http_port: int = 3000
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES

    def __post_init__(self) -> None:
        # Without a secret, HTTP mode would accept requests signed with an empty key.
        if not self.app_token and not self.signing_secret:
            raise ValueError(
                "Slack needs SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET (HTTP mode) "
                "besides SLACK_BOT_TOKEN; see docs/slack.md"
            )

    @property
    def socket_mode(self) -> bool:
        return bool(self.app_token)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlackConfig | None:
        """None when SLACK_BOT_TOKEN is unset; ValueError when it is set but unusable."""

        def get(name: str) -> str | None:
            return (env.get(name) or "").strip() or None

        bot_token = get("SLACK_BOT_TOKEN")
        if bot_token is None:
            return None
        if not bot_token.startswith("xoxb-"):
            raise ValueError("SLACK_BOT_TOKEN must be the bot token (it starts with xoxb-)")
        app_token, signing_secret = get("SLACK_APP_TOKEN"), get("SLACK_SIGNING_SECRET")
        if app_token is not None and not app_token.startswith("xapp-"):
            raise ValueError("SLACK_APP_TOKEN must be an app-level token (it starts with xapp-)")
        return cls(
            bot_token=bot_token,
            app_token=app_token,
            signing_secret=signing_secret,
            api_url=get("SLACK_API_URL"),
            http_host=get("SLACK_HTTP_HOST") or "0.0.0.0",
            http_port=_int_setting(env, "SLACK_HTTP_PORT", 3000, low=0, high=65_535),
            max_upload_bytes=_int_setting(env, "SLACK_MAX_UPLOAD_BYTES", DEFAULT_MAX_UPLOAD_BYTES, low=1),
        )


def _int_setting(env: Mapping[str, str], name: str, default: int, *, low: int, high: int | None = None) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {raw!r}") from None
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be between {low} and {high}" if high is not None else f"{name} must be >= {low}")
    return value


# --------------------------------------------------------------------------- small helpers

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A bounded mapping that forgets the least recently used entries (and, with a
    ttl, entries older than ttl seconds: names and channels do get renamed)."""

    def __init__(self, capacity: int, ttl: float | None = None) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self._items: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        value, stored = item
        if self.ttl is not None and time.monotonic() - stored > self.ttl:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = (value, time.monotonic())
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._items


class EventDeduper(Protocol):
    """Remembers delivered Events API ids, so Slack's retries are answered once,
    for a bot without an event journal (a bot with one, the runtime, recognises
    repeats by the journal's key, in every process: bot/durable/)."""

    async def seen(self, event_id: str) -> bool:
        """Whether `event_id` was seen before; records it if not."""
        ...


class RecentEventIds:
    """The default deduper: the last `capacity` event ids, in memory. Slack retries
    within minutes, so a few thousand ids cover any burst of retries."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._ids: LRU[str, bool] = LRU(capacity)

    async def seen(self, event_id: str) -> bool:
        if event_id in self._ids:
            return True
        self._ids.put(event_id, True)
        return False


def time_of(ts: str | float | None) -> datetime:
    """A Slack timestamp (`ts`, `event_time`) as an aware datetime; now if there is none."""
    try:
        return datetime.fromtimestamp(float(ts or ""), UTC)
    except ValueError:
        return datetime.now(UTC)


def name_of(user: Mapping[str, Any]) -> str | None:
    profile = user.get("profile") or {}
    for name in (profile.get("display_name"), profile.get("real_name"), user.get("real_name"), user.get("name")):
        if name and str(name).strip():
            return str(name).strip()
    return None


def human_size(count: int) -> str:
    for unit, scale in (("MB", 1024 * 1024), ("KB", 1024)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} bytes"


def error_code(error: BaseException) -> str:
    """A Web API error's code (e.g. channel_not_found), or the exception's type: never a payload."""
    if isinstance(error, SlackApiError):
        return str(error.response.get("error") or error.response.status_code)
    return type(error).__name__
