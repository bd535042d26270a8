"""Copies of forgotten channel lines in other people's memories.

A channel line (or a channel note) lives on where the bot quoted it: a
conversation_search result in bob's recall listing alice's line, bob's reply
that repeats it (his recall's send_message call, and the outbox's text of the
reply sent). When alice's line is forgotten, those copies go too.

What counts as a copy: a message the bot produced (a function call or its
result, an answer: roles `tool` and `assistant`) that holds a run of QUOTE_RUN
consecutive words of the line, or the whole line when it is shorter; words are
compared lowercased, whitespace, punctuation and JSON escapes aside (a result
is JSON, a call's arguments are JSON). A line of fewer than SHORT_LINE words
("ok", "sounds good") is looked for in function results only: an answer that
says the same few words is not a copy of it. What bob himself wrote stays (his
words, even repeating hers, are his), as does a paraphrase.

A copy goes as a forget of a topic makes a message go: with the other half of
its function call (bot/forgetting/matching.py: with_their_pairs), through the
holder's door, so a loaded agent reads what is left. The inbox and outbox
copies of the holder's finished events are emptied too (Store.inbox_scrub:
they only serve to recognise a repeated id, bot/forgetting/erasing.py says why),
which takes the reply text that quoted the line.

Only conversations held in channels are read: a channel's memory is never
readable from a DM, so no DM holds a copy.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from bot.forgetting.matching import with_their_pairs
from memory.places import DM_KEY
from memory.types import Message, is_person_key

if TYPE_CHECKING:
    from bot.door import Doors
    from memory.store import Store

log = logging.getLogger(__name__)

QUOTE_RUN = 6  # consecutive words of a line that make a copy of it
SHORT_LINE = 4  # lines of fewer words are looked for in function results only
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class Quotes:
    """Whether texts quote any of some lines."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.runs: set[tuple[str, ...]] = set()  # from lines of SHORT_LINE words or more
        self.short: set[tuple[str, ...]] = set()  # whole short lines
        for line in lines:
            said = words(line)
            if not said:
                continue
            if len(said) < SHORT_LINE:
                self.short.add(tuple(said))
                continue
            size = min(QUOTE_RUN, len(said))
            self.runs.update(tuple(said[i : i + size]) for i in range(len(said) - size + 1))
        self.sizes = sorted({len(run) for run in self.runs | self.short})

    def __bool__(self) -> bool:
        return bool(self.runs or self.short)

    def held_by(self, message: Message) -> bool:
        if message.role not in ("tool", "assistant"):
            return False
        wanted = self.runs | self.short if message.role == "tool" else self.runs
        for text in _texts(message):
            said = words(text)
            for size in self.sizes:
                if any(tuple(said[i : i + size]) in wanted for i in range(len(said) - size + 1)):
                    return True
        return False


def _texts(message: Message) -> Iterator[str]:
    """A message's text and the strings of the JSON it holds (a result, a call's arguments), unescaped."""
    if message.content:
        yield message.content
        yield from _json_strings(message.content)
    for call in message.tool_calls or []:
        arguments = call.get("function", {}).get("arguments", "")
        if isinstance(arguments, str):
            yield from _json_strings(arguments)


def _json_strings(text: str) -> Iterator[str]:
    try:
        value: Any = json.loads(text)
    except ValueError:
        return
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


async def channel_places(store: Store, agent_id: str) -> list[str]:
    """The places of the agent's conversations in channels ("public:C7", ...)."""
    return [c.place for c in await store.list_conversations(agent_id) if c.place != DM_KEY]


async def copies_of(store: Store, agent_id: str, quotes: Quotes, places: Sequence[str] | None = None) -> list[Message]:
    """The agent's messages in channel conversations that quote one of the lines, with their pairs."""
    places = await channel_places(store, agent_id) if places is None else places
    held: list[Message] = []
    history: list[Message] = []
    for place in places:
        messages = await store.messages_since(agent_id, 0, place=place)
        history.extend(messages)
        held.extend(message for message in messages if quotes.held_by(message))
    return with_their_pairs(held, history) if held else []


async def remove_copies(
    store: Store, doors: Doors, lines: Sequence[str], *, owner: str, channels: Collection[str] = ()
) -> int:
    """Delete every copy of `lines` in the memories of people other than
    `owner` (who forgot them), each through its agent's door; how many messages went.

    Everyone who talked with the bot in one of `channels` (the ids of the channels the
    lines were said in) also has their agent's door passed, copies or not: a search
    result is kept as a placeholder but shown whole while their agent stays loaded
    (Message.shown), as are a channel's notes in its system message; the door's pass
    reloads it, here and, under leases, in every process."""
    quotes = Quotes(lines)
    if not quotes:
        return 0
    removed = 0
    for agent in await store.list_agents():
        if agent.key == owner or not is_person_key(agent.key):
            continue
        places = await channel_places(store, agent.id)
        was_there = any(place.partition(":")[2] in channels for place in places)
        if not was_there and not await copies_of(store, agent.id, quotes, places):  # most people hold none
            continue

        async def removing(agent_id: str = agent.id, key: str = agent.key) -> int:
            copies = await copies_of(store, agent_id, quotes)  # again, in their turn
            deleted = await store.delete_messages(agent_id, [message.seq for message in copies])
            await store.inbox_scrub(key)
            return deleted

        gone = await doors.admin(agent.key, removing)
        log.info("%s: removed %d messages quoting forgotten channel lines of %s", agent.key, gone, owner)
        removed += gone
    if removed:
        await store.flush_deleted()
    return removed
