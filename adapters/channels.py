"""What both platform adapters decide the same way about a channel: its mode by
the operator's settings (always-on channels are `open`, listening channels
`listen`, the rest `mention`; a thread inherits its channel's; a manager's
/channel overrides them, bot/channels/), and
how much of its recent conversation it reads when answering there (channel
context, read with each platform's own API: a failure there costs the context,
never the answer, and is logged once per channel).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from cachetools import LRUCache

from bot.channels.port import Mode
from bot.config import setting
from bot.errors import ConfigError
from bot.events import ChannelLine

log = logging.getLogger(__name__)

Id = TypeVar("Id")

CHANNEL_CONTEXT_SETTING = "MEMGPT_CHANNEL_CONTEXT_MESSAGES"


def id_list(value: str, name: str, *, valid: Callable[[str], bool], what: str) -> list[str]:
    """The comma-separated ids of setting `name`; a ConfigError naming the first bad one."""
    parts = [part.strip() for part in value.split(",") if part.strip()]
    bad = [part for part in parts if not valid(part)]
    if bad:
        raise ConfigError(f"{name} takes comma-separated {what}, not {bad[0]!r}")
    return parts


def always_on(ids: Collection[Id], channel: Id | None, parent: Id | None = None) -> bool:
    """Whether a message in `channel` (a thread of `parent`, if given) is for the bot
    without a mention: a thread inherits its parent channel's setting."""
    return (channel is not None and channel in ids) or (parent is not None and parent in ids)


def default_mode(
    open_ids: Collection[Id], listen_ids: Collection[Id], channel: Id | None, parent: Id | None = None
) -> Mode:
    """A channel's mode by the operator's settings (SLACK_/DISCORD_ALWAYS_ON_CHANNELS: open;
    SLACK_/DISCORD_LISTEN_CHANNELS: listen); a thread of `parent` inherits its mode."""
    if always_on(open_ids, channel, parent):
        return "open"
    if always_on(listen_ids, channel, parent):
        return "listen"
    return "mention"


def context_messages(env: Mapping[str, str]) -> int:
    """How many recent channel messages to read for context (0: none)."""
    return int(setting(env, CHANNEL_CONTEXT_SETTING))


class ContextFailures:
    """Says once per channel (not on every message) why its context cannot be read."""

    def __init__(self, platform: str, advice: str) -> None:
        self.platform = platform
        self.advice = advice  # what the operator can do about it
        self._warned: LRUCache[str, bool] = LRUCache(1_000)

    def failed(self, channel: str, reason: str) -> list[ChannelLine]:
        """Log the failure (the first time for this channel); the context to go on with: none."""
        if channel not in self._warned:
            self._warned[channel] = True
            log.warning(
                "%s: cannot read the recent messages of channel %s (%s), so the bot answers there "
                "without channel context; %s",
                self.platform,
                channel,
                reason,
                self.advice,
            )
        return []
