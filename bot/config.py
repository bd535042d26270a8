"""Settings from environment variables and an optional `.env` file.

Every name here is documented, with its default, in `.env.example`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from dotenv import load_dotenv

from bot.events import agent_key, parse_user

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
# The daily token budget per user, unless set: this many full context windows
# (a cap on abuse that scales with what one call can cost; bot/limits.py).
BUDGET_WINDOWS = 50


class ConfigError(Exception):
    """A setting is missing or malformed; the message says which and how to fix it."""


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
    flush_threshold: float = 1.00
    evict_fraction: float = 0.75
    # Tokens kept free for the model's answer; counted against the window.
    response_reserve: int = 1_024
    max_steps_per_event: int = 8
    persona_limit: int = 2_000
    human_limit: int = 2_000
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
    embedding_model: str = ""  # empty: the bundled all-MiniLM-L6-v2
    # Empty: the embedded SQLite store under data_dir. May hold a password: not in the repr.
    mongodb_uri: str = field(default="", repr=False)
    mongodb_db: str = "memgpt"
    # Seconds an event waits (retrying with backoff) for a busy, full or
    # unreachable store before the person is told (bot/durable/store_wait.py).
    store_wait: float = 120.0
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env_file: str | os.PathLike[str] | None = ".env") -> Settings:
        if env_file is not None:
            load_dotenv(env_file, override=False)
        env = os.environ
        settings = cls()
        settings.openai_api_key = env.get("OPENAI_API_KEY", "")
        settings.openai_base_url = env.get("OPENAI_BASE_URL") or None
        settings.model = env.get("MEMGPT_MODEL", settings.model)
        settings.context_window = _int(env, "MEMGPT_CONTEXT_WINDOW", context_window_for(settings.model))
        if env.get("MEMGPT_DATA_DIR"):
            settings.data_dir = Path(env["MEMGPT_DATA_DIR"]).expanduser()
        settings.fallback_encoding = env.get("MEMGPT_TOKENIZER_ENCODING", settings.fallback_encoding)
        settings.warning_threshold = _float(env, "MEMGPT_WARNING_THRESHOLD", settings.warning_threshold)
        settings.flush_threshold = _float(env, "MEMGPT_FLUSH_THRESHOLD", settings.flush_threshold)
        settings.evict_fraction = _float(env, "MEMGPT_EVICT_FRACTION", settings.evict_fraction)
        settings.response_reserve = _int(
            env, "MEMGPT_RESPONSE_RESERVE", min(settings.response_reserve, settings.context_window // 8)
        )
        settings.max_steps_per_event = _int(env, "MEMGPT_MAX_STEPS", settings.max_steps_per_event)
        settings.persona_limit = _int(env, "MEMGPT_PERSONA_LIMIT", settings.persona_limit)
        settings.human_limit = _int(env, "MEMGPT_HUMAN_LIMIT", settings.human_limit)
        settings.search_page_size = _int(env, "MEMGPT_SEARCH_PAGE_SIZE", settings.search_page_size)
        settings.max_message_tokens = _int(env, "MEMGPT_MAX_MESSAGE_TOKENS", settings.max_message_tokens)
        settings.queue_tokens = _int(env, "MEMGPT_QUEUE_TOKENS", settings.queue_tokens)
        settings.cached_token_weight = _float(env, "MEMGPT_CACHED_TOKEN_WEIGHT", settings.cached_token_weight)
        settings.summary_model = env.get("MEMGPT_SUMMARY_MODEL", "").strip()
        settings.rate_limit_per_minute = _int(env, "MEMGPT_RATE_LIMIT_PER_MINUTE", settings.rate_limit_per_minute)
        settings.daily_token_budget = _int(env, "MEMGPT_DAILY_TOKEN_BUDGET", BUDGET_WINDOWS * settings.context_window)
        settings.unlimited_users = _users(env, "MEMGPT_UNLIMITED_USERS")
        settings.llm_timeout = _float(env, "MEMGPT_LLM_TIMEOUT", settings.llm_timeout)
        settings.llm_max_retries = _int(env, "MEMGPT_LLM_MAX_RETRIES", settings.llm_max_retries)
        settings.embedding_model = env.get("MEMGPT_EMBEDDING_MODEL", settings.embedding_model)
        settings.mongodb_uri = env.get("MONGODB_URI", "")
        settings.mongodb_db = env.get("MONGODB_DB", "") or settings.mongodb_db
        settings.store_wait = _float(env, "MEMGPT_STORE_WAIT", settings.store_wait)
        settings.log_level = env.get("MEMGPT_LOG_LEVEL", settings.log_level).upper()
        settings.validate()
        return settings

    def validate(self) -> None:
        if not 0 < self.warning_threshold <= self.flush_threshold <= 1.0:
            raise ConfigError(
                "need 0 < MEMGPT_WARNING_THRESHOLD <= MEMGPT_FLUSH_THRESHOLD <= 1.0, got "
                f"{self.warning_threshold} and {self.flush_threshold}"
            )
        if not 0.1 <= self.evict_fraction <= 0.9:
            raise ConfigError(f"MEMGPT_EVICT_FRACTION must be between 0.1 and 0.9, got {self.evict_fraction}")
        if self.context_window < 1_024:
            raise ConfigError(f"MEMGPT_CONTEXT_WINDOW must be at least 1024 tokens, got {self.context_window}")
        if not 0.0 <= self.cached_token_weight <= 1.0:
            raise ConfigError(
                f"MEMGPT_CACHED_TOKEN_WEIGHT must be between 0 and 1 (1: a cached token counts in full), "
                f"got {self.cached_token_weight}"
            )
        if 0 < self.queue_tokens < 256:
            raise ConfigError(
                f"MEMGPT_QUEUE_TOKENS must be 0 (what the window leaves) or at least 256, got {self.queue_tokens}"
            )
        if self.store_wait < 0:
            raise ConfigError(f"MEMGPT_STORE_WAIT must be 0 (do not wait) or more seconds, got {self.store_wait}")
        if self.max_steps_per_event < 1:
            raise ConfigError("MEMGPT_MAX_STEPS must be at least 1")
        for name, value in (
            ("MEMGPT_MAX_MESSAGE_TOKENS", self.max_message_tokens),
            ("MEMGPT_QUEUE_TOKENS", self.queue_tokens),
            ("MEMGPT_RATE_LIMIT_PER_MINUTE", self.rate_limit_per_minute),
            ("MEMGPT_DAILY_TOKEN_BUDGET", self.daily_token_budget),
        ):
            if value < 0:
                raise ConfigError(f"{name} must be 0 (off / automatic) or more, got {value}")

    def redacted(self) -> dict[str, object]:
        """Settings safe to print or log: secrets shown only as set / not set."""
        shown: dict[str, object] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            secret = "key" in item.name or item.name == "mongodb_uri"  # a URI may carry a password
            shown[item.name] = ("set" if value else "not set") if secret else value
        return shown


def _int(env: os._Environ[str] | dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.replace("_", ""))
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None


def _float(env: os._Environ[str] | dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def _users(env: os._Environ[str] | dict[str, str], name: str) -> tuple[str, ...]:
    """Comma-separated users (NAME or PLATFORM:ID, as `--user` takes them) as agent keys."""
    keys = []
    for spec in (env.get(name) or "").split(","):
        if not spec.strip():
            continue
        try:
            keys.append(agent_key(*parse_user(spec.strip())))
        except ValueError as error:
            raise ConfigError(f"{name}: {error}") from None
    return tuple(dict.fromkeys(keys))
