"""The Slack adapter's settings, read from the environment, and the
platform's constants that every part of the adapter shares."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from adapters.channels import context_messages, id_list

PLATFORM = "slack"
REPLY_LIMIT = 3_000  # Slack truncates long texts and renders ~4,000 chars per message well
DEFAULT_MAX_UPLOAD_BYTES = 5 * 1024 * 1024
CHANNEL_ID = re.compile(r"[CG][A-Z0-9]+")  # public (C...) and private (G..., older) channels
USER_ID = re.compile(r"[UW][A-Z0-9]+")  # people (W...: Enterprise Grid)


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
    # Channels where every message (not only a mention) is for the bot, as on Discord.
    always_on_channels: frozenset[str] = frozenset()
    # Channels whose messages the bot keeps for the channel, answering only mentions
    # (SLACK_LISTEN_CHANNELS); a manager's /channel overrides both lists.
    listen_channels: frozenset[str] = frozenset()
    # Who may change a channel's mode with /channel besides workspace admins and owners.
    channel_managers: frozenset[str] = frozenset()
    # How many recent messages of a channel the bot reads when answering there
    # (MEMGPT_CHANNEL_CONTEXT_MESSAGES; 0: none).
    channel_context_messages: int = 20

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
            always_on_channels=_channel_ids(env, "SLACK_ALWAYS_ON_CHANNELS"),
            listen_channels=_channel_ids(env, "SLACK_LISTEN_CHANNELS"),
            channel_managers=frozenset(
                id_list(
                    env.get("SLACK_CHANNEL_MANAGERS", ""),
                    "SLACK_CHANNEL_MANAGERS",
                    valid=USER_ID.fullmatch,  # type: ignore[arg-type]  # a match object is truthy
                    what="member ids (U0123ABCD: a profile's ⋮ menu → Copy member ID)",
                )
            ),
            channel_context_messages=context_messages(env),
        )


def _channel_ids(env: Mapping[str, str], name: str) -> frozenset[str]:
    return frozenset(
        id_list(
            env.get(name, ""),
            name,
            valid=CHANNEL_ID.fullmatch,  # type: ignore[arg-type]  # a match object is truthy
            what="channel ids (C0123ABCD: the channel's details show it)",
        )
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
