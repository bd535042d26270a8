"""Slack: Events API in, chat.postMessage out (adapters/slack/adapter.py tells how)."""

from adapters.pipeline import APOLOGY
from adapters.slack.adapter import SlackAdapter
from adapters.slack.app import EVENTS_PATH
from adapters.slack.commands import FORGET_CANCEL, FORGET_CONFIRM
from adapters.slack.config import PLATFORM, REPLY_LIMIT, SlackConfig, SlackSetupError
from adapters.slack.send import METADATA_TYPE

__all__ = [
    "APOLOGY",
    "EVENTS_PATH",
    "FORGET_CANCEL",
    "FORGET_CONFIRM",
    "METADATA_TYPE",
    "PLATFORM",
    "REPLY_LIMIT",
    "SlackAdapter",
    "SlackConfig",
    "SlackSetupError",
]
