"""Places: where something was said, and from where it may be read again.

A person has one agent (one memory), but talks to it in several places: their
direct messages with the bot, private channels (and group DMs), public
channels. Each place is a conversation of its own (its own queue and recursive
summary), and everything the memory keeps records the place it came from, as
a conversation key (`Place.key`): "dm", "private:<channel id>" or
"public:<channel id>".

The rule of who may read what (`Visibility`) is enforced by the stores on every
read path, not left to the model's discretion:

- said or saved in a DM: visible only in that person's DMs;
- in a private channel: in that channel and in the person's DMs;
- in a public channel: everywhere the person talks to the bot.

Items whose place is unknown (kept before places existed) count as DM-only:
the safe side. Shared collections attached by an operator are visible
everywhere they are attached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

PlaceKind = Literal["dm", "private", "public"]
DM_KEY = "dm"
PUBLIC_PREFIX = "public:"
# Every public key sorts in [PUBLIC_PREFIX, PUBLIC_END): a range a store's
# (agent, place) index serves, where a LIKE or a regex might not.
PUBLIC_END = PUBLIC_PREFIX[:-1] + chr(ord(PUBLIC_PREFIX[-1]) + 1)


@dataclass(frozen=True, slots=True)
class Place:
    """Where an event happened. `id` is the platform's channel id ("" for a
    DM: all of a person's DMs with the bot are one conversation); a thread
    shares its channel's conversation and kind, `thread` only says which one."""

    kind: PlaceKind = "dm"
    id: str = ""
    name: str = ""  # for people and the model: "#general", "a direct message"
    thread: str = ""
    # Worked out once here, not at each of the many reads of one event's way.
    key: str = field(init=False, repr=False, compare=False)  # the conversation (what stored items record)
    is_dm: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", DM_KEY if self.kind == "dm" else f"{self.kind}:{self.id}")
        object.__setattr__(self, "is_dm", self.kind == "dm")

    def describe(self) -> str:
        """Where the agent is speaking and who can read it, for its instructions."""
        if self.kind == "dm":
            return "a direct message with this person: only they read what you write here."
        name = self.name or self.id
        if self.kind == "private":
            return f"the private channel {name}: its members read what you write here."
        return f"the public channel {name}: anyone in the workspace may read what you write here."

    @classmethod
    def from_key(cls, key: str, name: str = "") -> Place:
        """The place of a stored conversation key (unknown keys: a DM, the safe side)."""
        kind, _, place_id = key.partition(":")
        if kind in ("private", "public") and place_id:
            return cls("private" if kind == "private" else "public", place_id, name)
        return cls(name=name)


DM = Place()


@dataclass(frozen=True, slots=True)
class Visibility:
    """Which stored items a read made from `place` may return. Stores apply
    it as a filter on the item's place key: everything (`everything`), or the
    keys in `places` plus every public one (`public`)."""

    everything: bool
    places: frozenset[str]
    public: bool

    @classmethod
    def of(cls, place: Place) -> Visibility:
        if place.kind == "dm":
            return cls(everything=True, places=frozenset(), public=True)
        return cls(everything=False, places=frozenset({place.key}), public=True)

    def sees(self, key: str) -> bool:
        """Whether an item recorded in conversation `key` is visible."""
        if self.everything or key in self.places:
            return True
        return self.public and key.startswith(PUBLIC_PREFIX)


EVERYWHERE = Visibility(everything=True, places=frozenset(), public=True)
