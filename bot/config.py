"""Settings from environment variables and an optional `.env` file, read once.

The environment is read in one place: `Settings.from_env` reads it (with the
`.env` file under it), checks every value against what can actually work, and
carries the result to every layer: the check-in and lease settings, and, for
the platform adapters, the merged environment itself (`Settings.environment`).

Every setting has one row in `SPECS` below (variable, attribute, reader with
its allowed range); a bad value stops the start with one line naming the
variable, the value and what is allowed. Every name is documented, with its
default, in `.env.example`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bot.errors import ConfigError
from bot.events import agent_key, parse_user
from bot.settings import CheckinSettings, LeaseSettings

# Context windows of models people commonly point this bot at. Unknown models
# get DEFAULT_CONTEXT_WINDOW; MEMGPT_CONTEXT_WINDOW overrides either.
KNOWN_CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-5": 400_000,
    "gpt-5-mini": 400_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "llama3": 8_192,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "qwen2.5": 32_768,
    "mistral": 32_768,
}
DEFAULT_CONTEXT_WINDOW = 8_192
DEFAULT_RESPONSE_RESERVE = 1_024
# The daily token budget per user, unless set: this many full context windows
# (a cap on abuse that scales with what one call can cost; bot/limits.py).
BUDGET_WINDOWS = 50
# Room for one ordinary message (and the wrappers around it) when deciding
# whether a window can hold a conversation at all (`check_window`).
ONE_MESSAGE_TOKENS = 256
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def context_window_for(model: str) -> int:
    if model in KNOWN_CONTEXT_WINDOWS:
        return KNOWN_CONTEXT_WINDOWS[model]
    # "llama3.1:8b", "gpt-4o-2024-08-06": match on the longest known prefix.
    candidates = [name for name in KNOWN_CONTEXT_WINDOWS if model.startswith(name)]
    if candidates:
        return KNOWN_CONTEXT_WINDOWS[max(candidates, key=len)]
    return DEFAULT_CONTEXT_WINDOW


def _default_data_dir() -> Path:
    return Path.home() / ".memgpt-bot" if Path.home().exists() else Path.cwd() / "data"


@dataclass(slots=True)
class Settings:
    openai_api_key: str = field(default="", repr=False)  # secret: never in a repr, a log or a traceback
    openai_base_url: str | None = None
    model: str = "gpt-4o-mini"
    context_window: int = DEFAULT_CONTEXT_WINDOW
    data_dir: Path = field(default_factory=_default_data_dir)
    # Encoding for models tiktoken does not know (local models); see memory/tokens.py.
    fallback_encoding: str = "cl100k_base"
    warning_threshold: float = 0.70
    flush_threshold: float = 0.96
    evict_fraction: float = 0.9
    # Tokens kept free for the model's answer; counted against the window.
    response_reserve: int = DEFAULT_RESPONSE_RESERVE
    max_steps_per_event: int = 8
    persona_limit: int = 2_000
    human_limit: int = 2_000
    # The private block (shown only in DMs, memory/working_context.py).
    private_limit: int = 1_000
    # A channel's notes (memory/channel_notes.py), shown to whoever's agent answers there.
    channel_notes_limit: int = 1_000
    search_page_size: int = 5
    # A queue item longer than this is shown to the model shortened, with a
    # note (it stays whole in recall storage); 0: a quarter of the usable window.
    max_message_tokens: int = 0
    # Prompt cost (memory/queue_manager.py): a cap on the queue's tokens (0: what
    # the window leaves), the weight of a server-cached prompt token in the daily
    # budget, and a cheaper model for the recursive summary (empty: `model`).
    queue_tokens: int = 0
    cached_token_weight: float = 1.0
    summary_model: str = ""
    # Abuse and cost control (bot/limits.py); 0 turns a limit off.
    rate_limit_per_minute: int = 20
    daily_token_budget: int = BUDGET_WINDOWS * DEFAULT_CONTEXT_WINDOW
    unlimited_users: tuple[str, ...] = ()  # agent keys exempt from both limits
    llm_timeout: float = 60.0
    llm_max_retries: int = 3
    # Requests in flight to the LLM endpoint at once (0: no cap); the server's slot count.
    llm_concurrency: int = 4
    # Seconds all LLM calls of one message may take, steps and retries together (0: no budget).
    message_time_budget: float = 300.0
    # A model's plain-text answer (no function call) outside a heartbeat chain is sent as the reply.
    plain_text_replies: bool = True
    embedding_model: str = ""  # empty: the bundled all-MiniLM-L6-v2
    # Load the embedding model in the background at start (run, and chat at a
    # terminal), so the first search rarely waits for it.
    warm_up: bool = True
    # Empty: the embedded SQLite store under data_dir. May hold a password: not in the repr.
    mongodb_uri: str = field(default="", repr=False)
    mongodb_db: str = "memgpt"
    # Seconds an event waits (retrying with backoff) for a busy, full or
    # unreachable store before the person is told (bot/door.py: StoreWait).
    store_wait: float = 120.0
    # Messages of one person in one place within this many seconds of the
    # previous one become one event (bot/durable/debounce.py); 0: off.
    debounce_seconds: float = 1.5
    log_level: str = "INFO"
    # The log file is rotated at this size, keeping this many old files (cli/logs.py).
    log_max_bytes: int = 10 * 1024 * 1024
    log_backups: int = 5
    # Health and Prometheus metrics for `memgpt-bot run` (cli/health.py); 0: off.
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # Channel context (issue 12): when mentioned in a channel, the adapters read
    # this many of its recent messages (0: none), and the bot keeps at most this
    # many tokens of them in the prompt.
    channel_context_messages: int = 20
    channel_context_tokens: int = 1_200
    # Days a channel's memory keeps each line (bot/forgetting/retention.py); 0: until forgotten.
    channel_retention_days: int = 90
    checkins: CheckinSettings = field(default_factory=CheckinSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    # The merged environment (.env under the process environment), for the
    # platform adapters' own settings (cli/app.py). Holds tokens: never shown.
    environment: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, env_file: str | os.PathLike[str] | None = ".env") -> Settings:
        """Settings from the process environment over the `.env` file (when it
        exists), validated; a ConfigError names the first bad setting."""
        env = {**(read_env_file(Path(env_file)) if env_file is not None else {}), **os.environ}
        return cls.from_mapping(env)

    @classmethod
    def from_mapping(cls, env: Mapping[str, str]) -> Settings:
        settings = cls()
        for spec in SPECS:
            raw = env.get(spec.env)
            if raw is not None and raw.strip() != "":
                value = spec.parse(raw.strip())
            elif spec.default is not None:
                value = spec.default(settings)
            else:
                continue
            setattr(settings, spec.attr, value)
        settings.checkins = CheckinSettings.from_env(env)
        settings.leases = LeaseSettings.from_env(env)
        settings.environment = dict(env)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Checks between settings (each alone was checked by its reader)."""
        if not self.warning_threshold <= self.flush_threshold:
            raise ConfigError(
                "MEMGPT_WARNING_THRESHOLD must not be above MEMGPT_FLUSH_THRESHOLD, got "
                f"{self.warning_threshold} and {self.flush_threshold}"
            )
        if self.response_reserve > self.context_window // 2:
            raise ConfigError(
                f"MEMGPT_RESPONSE_RESERVE={self.response_reserve}: at most half the context window "
                f"({self.context_window // 2} of MEMGPT_CONTEXT_WINDOW={self.context_window}) may be kept for answers"
            )

    def check_window(self, fixed_prompt_tokens: int) -> None:
        """Refuse a window that cannot hold the fixed prompt (instructions,
        function schemas, working context), the response reserve and one
        message: every message would fail to fit."""
        needed = fixed_prompt_tokens + self.response_reserve + ONE_MESSAGE_TOKENS
        usable = int(self.context_window * self.flush_threshold)
        if usable < needed:
            # The default reserve grows with the window (an eighth, up to 1024): the
            # suggestion must still fit once that is taken into account.
            smallest = self.context_window
            while int(smallest * self.flush_threshold) < needed - self.response_reserve + max(
                self.response_reserve, min(DEFAULT_RESPONSE_RESERVE, smallest // 8)
            ):
                smallest += 16
            raise ConfigError(
                f"MEMGPT_CONTEXT_WINDOW={self.context_window}: too small for model {self.model}: the fixed prompt "
                f"takes {fixed_prompt_tokens} tokens, the response reserve {self.response_reserve} and one message "
                f"about {ONE_MESSAGE_TOKENS}; use at least {smallest} (or a smaller MEMGPT_RESPONSE_RESERVE)"
            )

    def redacted(self) -> dict[str, object]:
        """Settings safe to print or log: secrets shown only as set / not set."""
        shown: dict[str, object] = {}
        for item in fields(self):
            if item.name == "environment":  # platform tokens; every setting of ours is shown by name
                continue
            value = getattr(self, item.name)
            secret = "key" in item.name or item.name == "mongodb_uri"  # a URI may carry a password
            shown[item.name] = ("set" if value else "not set") if secret else value
        return shown


# -- the .env file -------------------------------------------------------------
def read_env_file(path: Path) -> dict[str, str]:
    """The settings in a `.env` file ({} when there is none). A line that is
    not `NAME=value` (or a comment) stops the start, naming file and line:
    python-dotenv alone would warn without the file name and drop the setting."""
    from dotenv.parser import parse_stream

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ConfigError(f"cannot read settings file {path}: {reason}") from None
    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            line = binding.original.string.strip()
            raise ConfigError(
                f"{path} line {binding.original.line}: not a setting: {line[:60]!r} "
                "(expected NAME=value, or # for a comment)"
            )
        if binding.key is not None and binding.value is not None:
            values[binding.key] = binding.value
    return values


# -- one row per setting ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Spec:
    env: str  # the variable
    attr: str  # the Settings attribute it sets
    read: Callable[[str], Any]  # raises ValueError saying what is allowed
    # Unset: a default that follows from settings read before it (rows run in
    # order), instead of the dataclass default.
    default: Callable[[Settings], Any] | None = None

    def parse(self, raw: str) -> Any:
        """The value of `raw`; a ConfigError naming the variable and what is allowed."""
        try:
            return self.read(raw)
        except ValueError as error:
            raise ConfigError(f"{self.env}={raw!r}: {error}") from None


def text(value: str) -> str:
    return value


def whole(minimum: int, maximum: int | None = None, *, zero: str = "") -> Callable[[str], int]:
    """A whole number in [minimum, maximum]; `zero` (e.g. "off") allows 0 too."""
    allowed = f"a whole number from {minimum}" + (f" to {maximum}" if maximum is not None else " up")
    if zero:
        allowed += f", or 0 ({zero})"

    def read(raw: str) -> int:
        try:
            value = int(raw.replace("_", ""))
        except ValueError:
            raise ValueError(f"must be {allowed}") from None
        if (zero and value == 0) or (value >= minimum and (maximum is None or value <= maximum)):
            return value
        raise ValueError(f"must be {allowed}")

    return read


def number(low: float, high: float | None = None, *, above: bool = False, zero: str = "") -> Callable[[str], float]:
    """A number from `low` (or above it) to `high`; `zero` allows 0 too."""
    allowed = f"a number {'above' if above else 'from'} {low:g}"
    if high is not None:
        allowed += f" {'and at most' if above else 'to'} {high:g}"
    if zero:
        allowed += f", or 0 ({zero})"

    def read(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"must be {allowed}") from None
        in_range = (value > low if above else value >= low) and (high is None or value <= high)
        if in_range or (zero and value == 0):
            return value
        raise ValueError(f"must be {allowed}")

    return read


def choice(*options: str) -> Callable[[str], str]:
    def read(raw: str) -> str:
        if raw.upper() in options:
            return raw.upper()
        raise ValueError(f"must be one of {', '.join(options)}")

    return read


def switch(raw: str) -> bool:
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be on or off (also true/false, yes/no, 1/0)")


def directory(raw: str) -> Path:
    return Path(raw).expanduser()


def users(raw: str) -> tuple[str, ...]:
    """Comma-separated users (NAME or PLATFORM:ID, as `--user` takes them) as agent keys."""
    keys = []
    for spec in raw.split(","):
        if spec.strip():
            keys.append(agent_key(*parse_user(spec.strip())))
    return tuple(dict.fromkeys(keys))


def _block_limit(default_text: Callable[[], str]) -> Callable[[str], int]:
    """A working-context block limit: at least the default text's length (a
    smaller one would cut it silently), at most 20,000 characters."""

    def read(raw: str) -> int:
        return whole(len(default_text()), 20_000)(raw)

    return read


def _persona() -> str:
    from memory.working_context import DEFAULT_PERSONA

    return DEFAULT_PERSONA


def _human() -> str:
    from memory.working_context import DEFAULT_HUMAN

    return DEFAULT_HUMAN


def _private() -> str:
    from memory.working_context import DEFAULT_PRIVATE

    return DEFAULT_PRIVATE


SPECS: tuple[Spec, ...] = (
    Spec("OPENAI_API_KEY", "openai_api_key", text),
    Spec("OPENAI_BASE_URL", "openai_base_url", text),
    Spec("MEMGPT_MODEL", "model", text),
    Spec("MEMGPT_CONTEXT_WINDOW", "context_window", whole(1_024), default=lambda s: context_window_for(s.model)),
    Spec("MEMGPT_DATA_DIR", "data_dir", directory),
    Spec("MEMGPT_TOKENIZER_ENCODING", "fallback_encoding", text),
    Spec("MEMGPT_WARNING_THRESHOLD", "warning_threshold", number(0, 1, above=True)),
    Spec("MEMGPT_FLUSH_THRESHOLD", "flush_threshold", number(0.1, 1)),
    Spec("MEMGPT_EVICT_FRACTION", "evict_fraction", number(0.1, 0.9)),
    Spec(
        "MEMGPT_RESPONSE_RESERVE",
        "response_reserve",
        whole(64),
        default=lambda s: min(DEFAULT_RESPONSE_RESERVE, s.context_window // 8),
    ),
    Spec("MEMGPT_MAX_STEPS", "max_steps_per_event", whole(1, 100)),
    Spec("MEMGPT_PERSONA_LIMIT", "persona_limit", _block_limit(_persona)),
    Spec("MEMGPT_HUMAN_LIMIT", "human_limit", _block_limit(_human)),
    Spec("MEMGPT_PRIVATE_LIMIT", "private_limit", _block_limit(_private)),
    Spec("MEMGPT_CHANNEL_NOTES_LIMIT", "channel_notes_limit", whole(100, 20_000)),
    Spec("MEMGPT_SEARCH_PAGE_SIZE", "search_page_size", whole(1, 50)),
    Spec("MEMGPT_MAX_MESSAGE_TOKENS", "max_message_tokens", whole(64, zero="a quarter of the usable window")),
    Spec("MEMGPT_QUEUE_TOKENS", "queue_tokens", whole(256, zero="as much as the window leaves")),
    Spec("MEMGPT_SUMMARY_MODEL", "summary_model", text),
    Spec("MEMGPT_RATE_LIMIT_PER_MINUTE", "rate_limit_per_minute", whole(1, zero="no limit")),
    Spec("MEMGPT_CACHED_TOKEN_WEIGHT", "cached_token_weight", number(0, 1)),
    Spec(
        "MEMGPT_DAILY_TOKEN_BUDGET",
        "daily_token_budget",
        whole(1, zero="no limit"),
        default=lambda s: BUDGET_WINDOWS * s.context_window,
    ),
    Spec("MEMGPT_UNLIMITED_USERS", "unlimited_users", users),
    Spec("MEMGPT_LLM_TIMEOUT", "llm_timeout", number(1, 3_600)),
    Spec("MEMGPT_LLM_MAX_RETRIES", "llm_max_retries", whole(0, 20)),
    Spec("MEMGPT_LLM_CONCURRENCY", "llm_concurrency", whole(1, 256, zero="no cap")),
    Spec("MEMGPT_MESSAGE_TIME_BUDGET", "message_time_budget", number(5, 86_400, zero="no budget")),
    Spec("MEMGPT_PLAIN_TEXT_REPLIES", "plain_text_replies", switch),
    Spec("MEMGPT_EMBEDDING_MODEL", "embedding_model", text),
    Spec("MEMGPT_WARM_UP", "warm_up", switch),
    Spec("MONGODB_URI", "mongodb_uri", text),
    Spec("MONGODB_DB", "mongodb_db", text),
    Spec("MEMGPT_STORE_WAIT", "store_wait", number(0, zero="do not wait")),
    Spec("MEMGPT_DEBOUNCE_SECONDS", "debounce_seconds", number(0.05, 30, zero="off")),
    Spec("MEMGPT_LOG_LEVEL", "log_level", choice(*LOG_LEVELS)),
    Spec("MEMGPT_LOG_MAX_BYTES", "log_max_bytes", whole(64 * 1024, zero="never rotate")),
    Spec("MEMGPT_LOG_BACKUPS", "log_backups", whole(1, 100)),
    Spec("MEMGPT_METRICS_PORT", "metrics_port", whole(1, 65_535, zero="off")),
    Spec("MEMGPT_METRICS_HOST", "metrics_host", text),
    Spec("MEMGPT_CHANNEL_CONTEXT_MESSAGES", "channel_context_messages", whole(1, 100, zero="no channel context")),
    Spec("MEMGPT_CHANNEL_CONTEXT_TOKENS", "channel_context_tokens", whole(100, 20_000)),
    Spec("MEMGPT_CHANNEL_RETENTION_DAYS", "channel_retention_days", whole(1, 36_500, zero="keep until forgotten")),
)


def setting(env: Mapping[str, str], variable: str) -> Any:
    """One setting's value from `env`, read and checked by its row in SPECS (its
    default when unset): for the adapters, which get the environment, not Settings."""
    [spec] = [spec for spec in SPECS if spec.env == variable]
    raw = (env.get(variable) or "").strip()
    if not raw:
        return spec.default(Settings()) if spec.default is not None else getattr(Settings(), spec.attr)
    return spec.parse(raw)
