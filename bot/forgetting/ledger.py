"""The memory ledger: what the bot holds on a person, item by item, with where
and when each was learned, in pages (for `/memory` and `memgpt-bot memory show`).

Items are the working-context lines, the saved passages (the person's own
archival storage), the summary of each place, and how many messages each
place holds. Each item but a count has an id ("note:<line id>", "passage:17",
"summary:dm") that `forget_item` takes: the buttons under `/memory` carry it,
and `/memory forget <id>` and `memgpt-bot memory forget --item <id>` type it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from bot.forgetting.erasing import Receipt
from bot.forgetting.matching import Found, block_lines
from bot.reports import only, plural
from memory.places import DM_KEY, Place
from memory.store import Store
from memory.types import AgentRecord, utc_now
from memory.working_context import forget_lines

PAGE_SIZE = 10
PREVIEW = 160  # characters of an item shown in the list


@dataclass(frozen=True, slots=True)
class Item:
    id: str  # "" for a count: not forgotten one by one
    kind: str  # "note", "passage", "summary", "messages" (a count), "message" (one, when forgetting)
    text: str
    place: str
    at: datetime | None
    shared: bool = False  # a note the person made visible everywhere
    place_name: str = ""  # "#general", when the place's conversation has one

    @property
    def shareable(self) -> bool:
        """A note kept for some places only, which the person may show everywhere."""
        return self.kind == "note" and not self.shared and not self.place.startswith("public:")

    def line(self, number: int) -> str:
        text = " ".join(self.text.split())
        text = text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"
        when = f", {self.at:%Y-%m-%d %H:%M} UTC" if self.at else ""
        shared = ", shared everywhere" if self.shared else ""
        name = f" [{self.id}]" if self.id else ""
        place = f"kept by channel {self.place_name}" if self.kind == "channel" else where(self.place, self.place_name)
        return f"{number}. {KIND_LABELS[self.kind]}: {text} ({place}{when}{shared}){name}"


KIND_LABELS = {
    "note": "Note",
    "passage": "Saved",
    "summary": "Summary",
    "messages": "Messages",
    "message": "Message",
    "channel": "Channel memory",  # what one channel's memory holds of them (bot/forgetting/channels.py)
    "channel_line": "Said in a channel",
    "channel_note": "Channel note",
}


@dataclass(frozen=True, slots=True)
class LedgerPage:
    items: list[Item]  # this page's
    page: int  # 1-based
    pages: int
    total: int

    def text(self) -> str:
        if not self.total:
            return "I hold nothing on you."
        head = f"What I hold on you: {plural(self.total, 'item')}, page {self.page} of {self.pages}."
        first = (self.page - 1) * PAGE_SIZE + 1
        lines = [head, *(item.line(first + n) for n, item in enumerate(self.items))]
        lines.append("")
        lines.append(
            "Forget one item: /memory forget <id>. Forget a topic everywhere: /forget about: <words>. "
            "Everything: /forget."
        )
        if any(item.kind == "channel" for item in self.items):
            lines.append("Stop channels keeping what you say (and forget what they kept): /memory channels off.")
        if any(item.shareable for item in self.items):
            lines.append("Let a note be known everywhere: /memory share <id>.")
        if self.page < self.pages:
            lines.append(f"More: /memory page {self.page + 1}.")
        return "\n".join(lines)


def where(place: str, name: str = "") -> str:
    """Where an item was learned, in words."""
    found = Place.from_key(place, name)
    if found.is_dm:
        return "learned in your DMs"
    label = found.name or found.id
    return f"learned in {'private' if found.kind == 'private' else 'public'} channel {label}"


async def ledger_items(store: Store, agent_id: str) -> list[Item]:
    """Every item held on the agent, in ledger order."""
    items: list[Item] = []
    for block in await store.load_blocks(agent_id):
        items.extend(
            Item(f"note:{line.id}", "note", line.text, line.place, line.written_at, line.shared)
            for line in block_lines(block)
        )
    count = await store.count_passages(agent_id)
    for passage in await store.list_passages(agent_id, count, 0) if count else []:
        items.append(Item(f"passage:{passage.id}", "passage", passage.text, passage.place, passage.created_at))
    conversations = sorted(await store.list_conversations(agent_id), key=lambda c: (c.place != DM_KEY, c.place))
    for conversation in conversations:
        if conversation.summary:
            items.append(
                Item(
                    f"summary:{conversation.place}",
                    "summary",
                    conversation.summary,
                    conversation.place,
                    conversation.summary_updated_at,
                )
            )
    for conversation in conversations:
        messages = await store.count_messages(agent_id, visible=only(conversation.place))
        if messages:
            items.append(Item("", "messages", plural(messages, "message"), conversation.place, None))
    names = {conversation.place: conversation.name for conversation in conversations if conversation.name}
    return [replace(item, place_name=names.get(item.place, "")) for item in items]


async def ledger_page(store: Store, agent_id: str, page: int = 1) -> LedgerPage:
    return paged(await ledger_items(store, agent_id), page)


def paged(items: list[Item], page: int = 1) -> LedgerPage:
    pages = max(1, -(-len(items) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    return LedgerPage(items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE], page, pages, len(items))


class UnknownItem(ValueError):
    """No item has this id (mistyped, or already forgotten)."""


async def forget_item(store: Store, agent: AgentRecord, item_id: str) -> Receipt:
    """Delete one ledger item by its id (and the inbox and outbox copies of the
    person's finished events: bot/forgetting/erasing.py); UnknownItem if there is none."""
    agent_id = agent.id
    kind, _, rest = item_id.strip().partition(":")
    await store.inbox_scrub(agent.key)
    if kind == "passage" and rest.isdecimal():
        count = await store.count_passages(agent_id)
        held = {p.id for p in await store.list_passages(agent_id, count, 0)} if count else set()
        if int(rest) in held:
            await store.delete_passages(agent_id, [int(rest)])
            await store.flush_deleted()
            return Receipt(passages=1)
    elif kind == "summary":
        for conversation in await store.list_conversations(agent_id):
            if conversation.place == rest and conversation.summary:
                await store.update_queue(agent_id, "", conversation.queue_start_seq, utc_now(), place=rest)
                await store.flush_deleted()
                return Receipt(summaries=1)
    elif kind == "note":
        for block in await store.load_blocks(agent_id):
            if any(line.id == rest for line in block_lines(block)):
                await forget_lines(store, agent_id, block.label, [rest])
                await store.flush_deleted()
                return Receipt(notes=1)
    raise UnknownItem(f"No item {item_id!r} (it may be forgotten already): /memory lists the ids.")


def describe_found(found: Found, shown: int = PAGE_SIZE) -> str:
    """What a topic matched, for the person to confirm: the counts, then the first items."""
    counts = found.counts()
    if found.empty:
        return f"I hold nothing about {found.about!r}."
    nouns = {  # kind: (one, many)
        "messages": ("message", "messages"),
        "passages": ("saved passage", "saved passages"),
        "notes": ("note", "notes"),
        "summaries": ("summary", "summaries"),
        "channel_lines": ("message kept by a channel", "messages kept by channels"),
        "channel_notes": ("channel note credited to you", "channel notes credited to you"),
    }
    held = ", ".join(f"{n} {nouns[kind][n != 1]}" for kind, n in counts.items() if n)
    items = [
        *(Item("", "message", m.content or m.searchable_text(), m.place, m.created_at) for m in found.messages),
        *(Item("", "passage", p.text, p.place, p.created_at) for p in found.passages),
        *(Item("", "note", line.text, line.place, line.written_at) for line in found.lines),
        *(Item("", "summary", c.summary, c.place, c.summary_updated_at) for c in found.summaries),
        *(Item("", "channel_line", line.text, line.place, line.said_at) for line in found.channel_lines),
        *(Item("", "channel_note", n.line.text, n.line.place, n.line.written_at) for n in found.channel_notes),
    ]
    lines = [f"About {found.about!r} I hold {held}:"]
    lines += [item.line(n) for n, item in enumerate(items[:shown], 1)]
    if len(items) > shown:
        lines.append(f"… and {len(items) - shown} more.")
    return "\n".join(lines)
