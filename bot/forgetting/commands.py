"""The runtime's memory-ledger calls (a mixin of Runtime): the ledger, one
item forgotten, a topic shown and then forgotten, for the CLI and the slash
commands (bot/commands/port.py); each reaches what channel memories hold of
the person too (bot/forgetting/channels.py). Each enters through the person's door
(bot/door.py: its turn, and for a change its lease), which drops the loaded
agent after a change, so its next event reads what is left."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from bot.forgetting.channels import ChannelCommands
from bot.forgetting.erasing import Receipt
from bot.forgetting.ledger import Item, LedgerPage, UnknownItem, forget_item, ledger_items, paged
from bot.forgetting.matching import Found, Matcher
from bot.forgetting.service import find_about, forget_about
from memory.types import Block, Message, Passage
from memory.working_context import MemoryEditError

if TYPE_CHECKING:
    from bot.door import Doors
    from bot.services import AgentServices
    from memory.store import Store

log = logging.getLogger(__name__)

SEARCH_RESULTS = 5  # of each kind, for /memory search


class LedgerCommands(ChannelCommands):
    store: Store
    services: AgentServices
    doors: Doors
    # Runtime's (the lease, the lane, the loaded agent reloaded): key, label, line id.
    share_line: Callable[[str, str, str], Awaitable[Block]]

    async def ledger(self, key: str, page: int = 1) -> LedgerPage | None:
        """Their own memory's items, then what each channel's memory holds of them."""

        async def reading() -> list[Item]:
            record = await self.store.find_agent(key)
            return [] if record is None else await ledger_items(self.store, record.id)

        items = await self.doors.admin(key, reading, changes=False)
        items += await self.channel_items(key)
        return paged(items, page) if items else None

    async def forget_one(self, key: str, item_id: str) -> Receipt:
        """Forget one ledger item; UnknownItem when there is none by that id."""
        kind, _, channel = item_id.strip().partition(":")
        if kind == "channel":  # their messages and the notes credited to them in one channel
            if not any(item.id == item_id.strip() for item in await self.channel_items(key)):
                raise UnknownItem(f"No item {item_id!r} (it may be forgotten already): /memory lists the ids.")
            erased = await self.erase_in_channels(key, channel=channel)
            return Receipt(channel_lines=erased.lines, channel_notes=erased.notes)

        async def forgetting() -> Receipt:
            record = await self.store.find_agent(key)
            if record is None:
                raise UnknownItem("I hold nothing on you.")
            return await forget_item(self.store, record, item_id)

        return await self.doors.admin(key, forgetting)

    async def preview_forget(self, key: str, about: str) -> Found:
        async def finding() -> Found:
            record = await self.store.find_agent(key)
            return Found(about) if record is None else await find_about(self.services, record.id, about)

        found = await self.doors.admin(key, finding, changes=False)
        matcher = Matcher(about, self.services.archival.embedder)
        found.channel_lines, found.channel_notes = await self.find_in_channels(key, matcher)
        return found

    async def forget_topic(self, key: str, about: str) -> Receipt:
        """Forget `about` in their memory, then in what channels hold of them (found again: it may have grown)."""

        async def forgetting() -> Receipt:
            record = await self.store.find_agent(key)
            if record is None:
                return Receipt()
            _, receipt = await forget_about(self.services, record, about)
            return receipt

        receipt = await self.doors.admin(key, forgetting)
        lines, notes = await self.find_in_channels(key, Matcher(about, self.services.archival.embedder))
        erased = await self.erase_in_channels(key, lines, notes)
        receipt = replace(receipt, channel_lines=erased.lines, channel_notes=erased.notes)
        log.info("%s: selective forget: %s", key, receipt)
        return receipt

    async def share_note(self, key: str, item_id: str) -> str:
        """Show one note (working-context line) everywhere, by its ledger id; the answer."""
        kind, _, line_id = item_id.strip().partition(":")

        async def reading() -> list[Block]:
            record = await self.store.find_agent(key)
            return await self.store.load_blocks(record.id) if record else []

        blocks = await self.doors.admin(key, reading, changes=False)
        label = next((b.label for b in blocks for line in b.lines if line.id == line_id), None)
        if kind != "note" or label is None:
            return f"No note {item_id!r} (it may be forgotten already): /memory lists the ids."
        try:
            await self.share_line(key, label, line_id)
        except MemoryEditError as error:
            return str(error)
        return "Shared: I now know this wherever we talk."

    async def search_memory(self, key: str, query: str, limit: int = SEARCH_RESULTS) -> str:
        """`/memory search <words>`: the person's own memory searched as the agent
        searches it (conversation search's ranking, archival search's hybrid)."""

        async def searching() -> tuple[list[Message], list[Passage]] | str:
            record = await self.store.find_agent(key)
            if record is None or not query.strip():
                return "I hold nothing on you." if record is None else "Search for what? /memory search <words>"
            messages = (await self.services.recall.search(record.id, query, limit)).items
            passages = []
            if await self.store.count_passages(record.id):
                found = await self.services.archival.search(record.id, query, limit)
                passages = [p for p, _ in found.items if getattr(p, "collection", None) is None]
            return messages, passages

        found = await self.doors.admin(key, searching, changes=False)
        if isinstance(found, str):
            return found
        messages, passages = found
        items = [Item("", "message", m.content or m.searchable_text(), m.place, m.created_at) for m in messages]
        items += [Item(f"passage:{p.id}", "passage", p.text, p.place, p.created_at) for p in passages]
        if not items:
            return f"Nothing held matches {query!r}."
        lines = [f"Best matches for {query!r} (messages, then saved passages):"]
        return "\n".join([*lines, *(item.line(n) for n, item in enumerate(items, 1))])
