"""The platform-neutral shapes of a slash command: who asks (`Caller`), what
they may type (`Option`), what the bot answers (`Answer`, with its `Button`s)
and what a press does (`Action`). Each platform parses its payload into these
and renders an `Answer` its own way (Slack Block Kit, Discord components)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.channels.port import ChannelRef, Mode
from bot.commands.port import CommandPort
from bot.events import agent_key

Args = Mapping[str, str | int]


@dataclass(frozen=True, slots=True)
class Caller:
    platform: str
    user_id: str
    reply_to: dict[str, Any] = field(default_factory=dict)  # their DM: where check-ins go
    # Where the command was typed, when that is a channel (None: a DM), with the mode the
    # operator's settings give it, and whether the caller manages it (asked only to change
    # it: Slack needs a users.info call).
    channel: ChannelRef | None = None
    default_mode: Mode = "mention"
    manages: Callable[[], Awaitable[bool]] | None = None

    @property
    def key(self) -> str:
        """Their agent's key: whose memory every command acts on."""
        return agent_key(self.platform, self.user_id)


@dataclass(frozen=True, slots=True)
class Button:
    action: str  # a name in ACTIONS (bot/commands/catalog.py)
    value: str  # what the press acts on: an item id, a topic; "" for nothing
    label: str  # beside its item, or under a question
    numbered: str = ""  # the label among all the buttons of a list, where they share one row ("Forget 3")
    danger: bool = False


@dataclass(frozen=True, slots=True)
class Entry:  # one item of a listed answer, with the buttons that act on it
    text: str
    buttons: tuple[Button, ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    """What a command or a press answers, seen by the person who asked alone."""

    text: str  # the whole answer, or the heading of a list
    markdown: bool = False  # the bot's own Markdown, not plain text that may quote the person
    entries: tuple[Entry, ...] = ()  # a list, each item with its buttons (the /memory ledger)
    footer: str = ""  # under the list
    buttons: tuple[Button, ...] = ()  # under the whole answer (a question's)
    expires: str = ""  # a question: what it says once left unanswered (where questions time out)
    announce: str = ""  # said in the channel, for everyone (the listening notice)

    @property
    def whole(self) -> str:
        """Everything as text, for a platform (or a notification) that shows it so."""
        listed = "\n".join([self.text, *(entry.text for entry in self.entries)])
        return f"{listed}\n\n{self.footer}" if self.footer else listed

    @property
    def all_buttons(self) -> tuple[Button, ...]:
        return (*(button for entry in self.entries for button in entry.buttons), *self.buttons)


Run = Callable[[CommandPort, Caller, Args], Awaitable[Answer]]
Act = Callable[[CommandPort, Caller, str], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    description: str
    default: str | int = ""  # its type is the option's type


# `/forget about: x`, `/memory page 2`: an option's name (a colon optional), then its value.
_NAMED = re.compile(r"(\w+)(?::\s*|\s+|$)(.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class SlashCommand:
    name: str
    description: str
    run: Run
    failed: str  # the answer when the bot fails
    options: tuple[Option, ...] = ()
    rest: str = ""  # the option a line of text fills when it names none (`/forget my diagnosis`)

    def option(self, name: str) -> Option:
        return next(option for option in self.options if option.name == name)

    def parse(self, text: str) -> dict[str, str | int]:
        """A platform's line of text after the command (Slack's) as the options given."""
        text = text.strip()
        named = _NAMED.fullmatch(text)
        option = next((o for o in self.options if named and o.name == named[1].lower()), None)
        if named and option is not None:
            value = named[2].strip()
            if isinstance(option.default, int):
                return {option.name: int(value)} if value.isdecimal() else {}
            return {option.name: value}
        return {self.rest: text} if self.rest and text else {}


@dataclass(frozen=True, slots=True)
class Action:
    """What a button does: its answer replaces the question (`closes`) or comes as a new message."""

    act: Act
    failed: str
    closes: bool = False
    working: str = ""  # shown at once where the platform wants an answer before the work is done
