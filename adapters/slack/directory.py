"""Who is who on Slack: the names of people, channels and workspaces, the bot's
own user id, and each person's DM channel. Looked up through the Web API when
first needed and kept a while (names do change, so at most an hour), so that a
busy conversation costs one `users.info`, not one per message.

Like discord.py's connection state, which keeps the users and channels it
has seen, this is the adapter's memory of the platform, not of the person:
the agent's memory lives in memory/.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache, TTLCache
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import CALL_ERRORS, error_code
from bot.events import PlaceKind

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Person:
    name: str
    is_bot: bool = False


@dataclass(frozen=True, slots=True)
class Channel:
    name: str  # "#general"; a DM's channel id
    kind: PlaceKind


def kind_of_channel(info: Mapping[str, Any]) -> PlaceKind:
    """A `conversations.info` channel's kind of place: a group DM and a private
    channel are private; anything Slack does not call private or a DM, public."""
    if info.get("is_im"):
        return "dm"
    if info.get("is_mpim") or info.get("is_private") or info.get("is_group"):
        return "private"
    return "public"


def name_of(user: Mapping[str, Any]) -> str | None:
    """The name a person goes by, from a `users.info` user or an event's `user_profile`."""
    profile = user.get("profile") or {}
    for name in (profile.get("display_name"), profile.get("real_name"), user.get("real_name"), user.get("name")):
        if name and str(name).strip():
            return str(name).strip()
    return None


class Directory:
    """Names and DM channels, cached. People are keyed `TEAM:USER` (the bot's user ids):
    in shared channels one workspace sees people of another."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self.bot_user_id: str | None = None  # known once connected (auth.test)
        self.bot_name = "the bot"  # its user name, once connected
        self.team_names: dict[str, str] = {}
        # Bounded (least recently used go first); names and channels do get renamed: an hour at most.
        self._people: TTLCache[str, Person] = TTLCache(5_000, ttl=3_600)
        self._channels: TTLCache[str, Channel] = TTLCache(2_000, ttl=3_600)
        self._dm_channels: LRUCache[str, str] = LRUCache(5_000)

    def learn(self, team: str, user: str, payload: Mapping[str, Any]) -> None:
        """Keep the name an event already carries (a `team_join`'s user)."""
        self._people[f"{team}:{user}"] = Person(name_of(payload) or user)

    def known_names(self, team: str) -> Callable[[str], str | None]:
        """Names already known, without asking Slack (for mentions inside a message)."""

        def known_name(user: str) -> str | None:
            person = self._people.get(f"{team}:{user}")
            return person.name if person else None

        return known_name

    async def person(self, team: str, user: str, profile: Mapping[str, Any] | None = None) -> Person:
        """The person's name: from the cache, the event's profile, or `users.info`."""
        key = f"{team}:{user}"
        person = self._people.get(key)
        if person is not None:
            return person
        name = name_of({"profile": profile}) if profile else None
        if name is not None:
            person = Person(name)
        else:
            try:
                info = (await self.client.users_info(user=user))["user"]
            except CALL_ERRORS as error:
                log.warning("slack: users.info for %s failed: %s", user, error_code(error))
                return Person(user)  # not cached: the next message tries again
            person = Person(name_of(info) or user, bool(info.get("is_bot")))
        self._people[key] = person
        return person

    async def channel_name(self, channel: str) -> str:
        """`#name`, or `channel C123` when Slack will not say."""
        info = await self.channel(channel)
        return info.name if info is not None else f"channel {channel}"

    async def channel(self, channel: str) -> Channel | None:
        """The channel's name and kind from `conversations.info` (cached); None when Slack
        will not say (not cached: the next event asks again)."""
        found = self._channels.get(channel)
        if found is None:
            try:
                info = (await self.client.conversations_info(channel=channel))["channel"]
            except (*CALL_ERRORS, KeyError) as error:
                log.info("slack: conversations.info for %s failed: %s", channel, error_code(error))
                return None
            found = Channel(f"#{info['name']}" if info.get("name") else channel, kind_of_channel(info))
            self._channels[channel] = found
        return found

    async def dm_channel(self, user: str) -> str:
        """The person's DM channel with the bot, opened on first use; raises CALL_ERRORS."""
        channel = self._dm_channels.get(user)
        if channel is None:
            try:
                opened = await self.client.conversations_open(users=user)
            except CALL_ERRORS as error:
                log.error("slack: conversations.open with %s failed: %s", user, error_code(error))
                raise
            channel = str(opened["channel"]["id"])
            self._dm_channels[user] = channel
        return channel
