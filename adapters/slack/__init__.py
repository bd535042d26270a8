"""Slack: Events API in, chat.postMessage out (adapters/slack/adapter.py tells how)."""

from adapters.slack.adapter import APOLOGY, SlackAdapter, SlackClosingError
from adapters.slack.app import EVENTS_PATH
from adapters.slack.commands import FORGET_ABOUT, FORGET_CANCEL, FORGET_CONFIRM, FORGET_ITEM, SHARE_ITEM
from adapters.slack.config import PLATFORM, REPLY_LIMIT, SlackConfig, SlackSetupError
from adapters.slack.dedupe import EventDeduper, RecentEventIds
from adapters.slack.send import METADATA_TYPE

__all__ = [
    "APOLOGY",
    "EVENTS_PATH",
    "FORGET_ABOUT",
    "FORGET_CANCEL",
    "FORGET_CONFIRM",
    "FORGET_ITEM",
    "METADATA_TYPE",
    "PLATFORM",
    "REPLY_LIMIT",
    "SHARE_ITEM",
    "EventDeduper",
    "RecentEventIds",
    "SlackAdapter",
    "SlackClosingError",
    "SlackConfig",
    "SlackSetupError",
]
