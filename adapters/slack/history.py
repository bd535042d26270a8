"""A channel's recent conversation, read when the bot answers there (channel
context): `conversations.history` before the message, or `conversations.replies`
inside a thread, with the bot's own token and scopes. Lines come oldest first,
without the message being answered, the bot's own marked as such, and names
resolved through the directory (one lookup per person, cached there). A
failure (a missing scope, a channel the bot cannot read, a rate limit) costs
the context, never the answer, and is logged once per channel.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from adapters.channels import ContextFailures
from adapters.slack.api import CALL_ERRORS, error_code
from adapters.slack.config import PLATFORM
from adapters.slack.directory import Directory
from adapters.slack.format import slack_to_plain, time_of
from bot.events import ChannelLine, Place

# What people (and other bots) say; joins, topic changes and the like are left out.
SPOKEN = (None, "bot_message", "file_share", "thread_broadcast", "me_message")
PAGE = 200  # replies read per call inside a thread (they come oldest first)
MAX_PAGES = 5  # a thread longer than PAGE * MAX_PAGES: its latest pages are not reached
ADVICE = (
    "give the Slack app the channels:history, groups:history, mpim:history and im:history "
    "scopes and reinstall it (docs/slack.md)"
)


class ChannelHistory:
    """The last `limit` messages before an event in its channel or thread (0: none)."""

    def __init__(self, client: AsyncWebClient, directory: Directory, limit: int) -> None:
        self.client = client
        self.directory = directory
        self.limit = limit
        self.failures = ContextFailures(PLATFORM, ADVICE)

    async def before(self, team: str, event: Mapping[str, Any], place: Place) -> list[ChannelLine]:
        if place.is_dm or self.limit <= 0:
            return []
        channel, ts = str(event.get("channel") or ""), str(event.get("ts") or "")
        try:
            messages = await (self._thread(channel, place.thread, ts) if place.thread else self._channel(channel, ts))
        except CALL_ERRORS as error:
            return self.failures.failed(channel, error_code(error))
        earlier = [message for message in messages if str(message.get("ts")) != ts]  # never the trigger itself
        return await self._lines(team, earlier[-self.limit :])

    async def _channel(self, channel: str, ts: str) -> list[Mapping[str, Any]]:
        found = await self.client.conversations_history(channel=channel, latest=ts, inclusive=False, limit=self.limit)
        return list(reversed(found.get("messages") or []))  # Slack lists the newest first

    async def _thread(self, channel: str, thread: str, ts: str) -> list[Mapping[str, Any]]:
        messages: list[Mapping[str, Any]] = []
        cursor = ""
        for _ in range(MAX_PAGES):
            page = await self.client.conversations_replies(
                channel=channel, ts=thread, latest=ts, inclusive=False, limit=PAGE, cursor=cursor or None
            )
            messages += page.get("messages") or []
            cursor = str((page.get("response_metadata") or {}).get("next_cursor") or "")
            if not page.get("has_more") or not cursor:
                break
        return messages

    async def _lines(self, team: str, messages: Sequence[Mapping[str, Any]]) -> list[ChannelLine]:
        own = self.directory.bot_user_id
        names: dict[str, str] = {}  # one lookup per person per read, even when it fails
        lines = []
        for message in messages:
            text = str(message.get("text") or "")
            if message.get("subtype") not in SPOKEN or not text.strip():
                continue
            user = str(message.get("user") or "")
            their_team = str(message.get("user_team") or message.get("team") or team)
            if own and user == own:
                author = self.directory.bot_name
            elif user and not message.get("bot_id"):
                if user not in names:
                    names[user] = (await self.directory.person(their_team, user, message.get("user_profile"))).name
                author = names[user]
            else:
                author = str(message.get("username") or (message.get("bot_profile") or {}).get("name") or "a bot")
            if own:
                text = re.sub(rf"<@{re.escape(own)}(?:\|[^>]*)?>", f"@{self.directory.bot_name}", text)
            plain = slack_to_plain(text, self.directory.known_names(team)).strip()
            mine = bool(own) and user == own
            author_id = f"{their_team}:{user}" if user else ""  # as the events' user_id (parse.py Origin)
            lines.append(ChannelLine(author, plain, time_of(message.get("ts")), from_bot=mine, author_id=author_id))
        return lines
