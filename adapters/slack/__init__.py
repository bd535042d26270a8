"""Slack: Events API in, chat.postMessage out (adapters/slack/adapter.py tells how)."""

from collections.abc import Mapping

from adapters.pipeline import APOLOGY
from adapters.slack.adapter import SlackAdapter
from adapters.slack.app import EVENTS_PATH
from adapters.slack.config import PLATFORM, REPLY_LIMIT, SlackConfig, SlackSetupError
from adapters.slack.send import METADATA_TYPE
from bot.ports import AdapterPort


def plan(bot: AdapterPort, env: Mapping[str, str]) -> tuple[SlackAdapter | None, str]:
    """The adapter for `memgpt-bot run` (adapters/platforms.py), or None and why not."""
    try:
        config = SlackConfig.from_env(env)
    except ValueError as error:
        return None, str(error)
    if config is None:
        return None, "SLACK_BOT_TOKEN is not set"
    if env.get("SLACK_APP_TOKEN"):
        mode = "Socket Mode (SLACK_APP_TOKEN)"
    else:
        host, port = env.get("SLACK_HTTP_HOST", "0.0.0.0"), env.get("SLACK_HTTP_PORT", "3000")
        mode = f"HTTP mode on {host}:{port}/slack/events (SLACK_SIGNING_SECRET)"
    # Retries are recognised across processes (and restarts) by the bot's inbox.
    return SlackAdapter(bot, config), mode


__all__ = [
    "APOLOGY",
    "EVENTS_PATH",
    "METADATA_TYPE",
    "PLATFORM",
    "REPLY_LIMIT",
    "SlackAdapter",
    "SlackConfig",
    "SlackSetupError",
    "plan",
]
