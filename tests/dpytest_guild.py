"""Looking up dpytest's test guild, its channels and its members by name: one
place for the Discord adapter, places and end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import discord
import discord.ext.test as dpytest

T = TypeVar("T")


def named(items: Iterable[T], name: str) -> T:
    found = discord.utils.get(items, name=name)
    assert found is not None, name
    return found


def the_guild() -> discord.Guild:
    return dpytest.get_config().guilds[0]


def guild_channel(name: str) -> discord.TextChannel:
    return named(the_guild().text_channels, name)


def guild_member(name: str) -> discord.Member:
    return named(dpytest.get_config().members, name)
