"""A bot port for adapter tests about what events an adapter builds (their
place, their channel context): it keeps each event it is handed, and each
inbox payload, and answers "noted". What the bot layer does with events is
tested with the real runtime elsewhere."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.channels.port import ChannelRef, Heard, Mode
from bot.durable.lanes import Lanes, Report, Send, StartGate, Turn
from bot.events import Delivery, Event, Redo, Reply, UserMessage
from bot.forgetting.erasing import Receipt
from bot.forgetting.ledger import UnknownItem
from bot.forgetting.matching import Found


@dataclass
class RecordingBot:
    """A bot port with an inbox that keeps every event and payload it is given."""

    events: list[Event] = field(default_factory=list)
    payloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Each person's turn and delivery order, as the bot's doors keep them (bot/door.py).
    lanes: Lanes = field(default_factory=Lanes)

    # The channel port: modes set here, lines heard (nothing is kept).
    modes: dict[str, Mode] = field(default_factory=dict)
    heard: list[Heard] = field(default_factory=list)

    # Turns held or awaited: what `settle` waits for, as the doors do.
    in_flight: set[asyncio.Event] = field(default_factory=set)

    @asynccontextmanager
    async def turn(self, key: str, *, after: StartGate | None = None) -> AsyncIterator[Turn]:
        done = asyncio.Event()
        self.in_flight.add(done)
        try:
            async with self.lanes.hold(key, after=after):
                yield Turn(key)
        finally:
            self.in_flight.discard(done)
            done.set()

    async def settle(self, within: float) -> int:
        waiting = [asyncio.create_task(done.wait()) for done in self.in_flight]
        if not waiting:
            return 0
        _, pending = await asyncio.wait(waiting, timeout=within)
        for task in pending:
            task.cancel()
        return len(pending)

    async def deliver(self, replies: Sequence[Reply], send: Send, report: Report | None = None) -> None:
        await self.lanes.deliver(replies, send, report or self.report_delivery)

    async def handle(self, event: Event, turn: Turn | None = None) -> list[Reply]:
        self.events.append(event)
        return [event.reply("noted")]

    async def receive(self, platform: str, event_id: str, user_id: str, payload: dict[str, Any]) -> bool:
        if event_id in self.payloads:  # a repeat delivery, as the inbox tells it
            return False
        self.payloads[event_id] = payload
        return True

    async def finished(self, event_id: str) -> None:
        return None

    async def leftovers(self, platform: str) -> list[Redo]:
        return []

    async def report_delivery(self, reply: Reply, outcome: Delivery, detail: str = "") -> Delivery:
        return outcome

    async def file_notice(self, reply: Reply) -> list[Reply]:
        return [reply]

    # The command port: this bot holds nothing, so there is nothing to list, share or forget.
    async def forget(self, key: str) -> bool:
        return False

    async def ledger(self, key: str, page: int = 1) -> None:
        return None

    async def forget_one(self, key: str, item_id: str) -> Receipt:
        raise UnknownItem("I hold nothing on you.")

    async def share_note(self, key: str, item_id: str) -> str:
        return "I hold nothing on you."

    async def search_memory(self, key: str, query: str) -> str:
        return "I hold nothing on you."

    async def preview_forget(self, key: str, about: str) -> Found:
        return Found(about)

    async def forget_topic(self, key: str, about: str) -> Receipt:
        return Receipt()

    async def channel_mode(self, channel: ChannelRef, default: Mode) -> Mode:
        return self.modes.get(channel.key, default)

    async def set_channel_mode(self, channel: ChannelRef, mode: Mode) -> str:
        self.modes[channel.key] = mode
        return ""

    async def hear(self, heard: Heard) -> str:
        self.heard.append(heard)
        return ""

    async def heard_edit(self, channel: ChannelRef, message_id: str, text: str, edited_at: datetime) -> None:
        return None

    async def heard_delete(self, channel: ChannelRef, message_id: str) -> None:
        return None

    def messages(self) -> list[UserMessage]:
        return [event for event in self.events if isinstance(event, UserMessage)]

    async def wait_for_messages(self, count: int, within: float = 10.0) -> list[UserMessage]:
        """Poll (every 20 ms) until `count` user messages arrived; all of them."""
        deadline = time.monotonic() + within
        while len(self.messages()) < count:
            assert time.monotonic() < deadline, f"{len(self.messages())} messages arrived, expected {count}"
            await asyncio.sleep(0.02)
        return self.messages()
