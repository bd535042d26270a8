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
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import CALL_ERRORS, error_code

log = logging.getLogger(__name__)

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


@dataclass(slots=True)
class Person:
    name: str
    is_bot: bool = False


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
        self.team_names: dict[str, str] = {}
        self._people: LRU[str, Person] = LRU(5_000, ttl=3_600)
        self._channel_names: LRU[str, str] = LRU(2_000, ttl=3_600)
        self._dm_channels: LRU[str, str] = LRU(5_000)

    def learn(self, team: str, user: str, payload: Mapping[str, Any]) -> None:
        """Keep the name an event already carries (a `team_join`'s user)."""
        self._people.put(f"{team}:{user}", Person(name_of(payload) or user))

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
        self._people.put(key, person)
        return person

    async def channel_name(self, channel: str) -> str:
        """`#name`, or `channel C123` when Slack will not say."""
        name = self._channel_names.get(channel)
        if name is None:
            try:
                info = (await self.client.conversations_info(channel=channel))["channel"]
                name = f"#{info['name']}" if info.get("name") else channel
            except (*CALL_ERRORS, KeyError) as error:
                log.info("slack: conversations.info for %s failed: %s", channel, error_code(error))
                return f"channel {channel}"
            self._channel_names.put(channel, name)
        return name

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
            self._dm_channels.put(user, channel)
        return channel
