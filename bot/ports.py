"""What adapters may ask of the bot. Adapters depend on this, never on memory:
the one thing they need to know of it (which uploads the document loader can
read) is answered here, in the bot's words."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import PurePath
from typing import Any, Protocol

from bot.channels.port import ChannelPort
from bot.commands.port import CommandPort
from bot.durable.lanes import Report, Send, StartGate, Turn
from bot.events import Delivery, Event, Redo, Reply
from memory.ingest.documents import document_kind


def readable(filename: str, content_type: str = "") -> bool:
    """Whether the bot can read an upload (text, Markdown, HTML, PDF), by its
    name or its media type, so adapters can refuse other files before
    downloading them. One list for every platform: the documents loader's."""
    return document_kind(PurePath(filename).name, content_type) is not None


class EventPort(Protocol):
    """What the event pipeline (adapters/pipeline.py) needs of the bot: each agent's
    turn and its handling (bot/door.py), and the inbox and outbox (bot/durable/)."""

    # A bot may also say `debounce_seconds` (MEMGPT_DEBOUNCE_SECONDS): the event
    # pipeline then hands it a person's quick messages in one place as one event,
    # the first with the others as its `followers`.

    def turn(self, key: str, *, after: StartGate | None = None) -> AbstractAsyncContextManager[Turn]:
        """The agent's one lane, held from building an event to its last reply; `after`:
        the platform's start-up gate to pass first (none for the last run's leftovers)."""
        ...

    async def handle(self, event: Event, turn: Turn | None = None) -> list[Reply]:
        """Run the event through the sender's agent's door; the replies to deliver."""
        ...

    async def deliver(self, replies: Sequence[Reply], send: Send, report: Report | None = None) -> None:
        """Send replies in each person's order, reporting each with an outbox entry
        (`report`, by default `report_delivery`)."""
        ...

    async def settle(self, within: float) -> int:
        """The one shutdown wait: at most `within` seconds for every kind of work in flight
        now (events, ticks, commands); how many were still running when it ended."""
        ...

    # Crash safety, the inbox and the outbox (bot/durable/__init__.py tells the protocol).
    async def receive(self, platform: str, event_id: str, user_id: str, payload: dict[str, Any]) -> bool:
        """Record an inbound event before acknowledging it (`payload`: what the
        adapter needs to handle it again, plain JSON). False for a repeat
        delivery. Raises when it cannot be recorded: do not acknowledge then."""
        ...

    async def finished(self, event_id: str) -> None:
        """Every reply to the event was sent or handed to the retrier."""
        ...

    async def leftovers(self, platform: str) -> list[Redo]:
        """The events a crash left unfinished, in arrival order: replay them at
        start (one given up carries the notice to send instead: `file_notice`)."""
        ...

    async def file_notice(self, reply: Reply) -> list[Reply]:
        """A notice about an event (not the agent's answer) filed in the outbox
        once: what to send now (nothing once it was sent before a crash)."""
        ...

    async def report_delivery(self, reply: Reply, outcome: Delivery, detail: str = "") -> Delivery:
        """How sending one reply went (only replies with an `outbox_id` need
        it); what became of it (UNDELIVERABLE once it failed too often)."""
        ...


class AdapterPort(EventPort, CommandPort, ChannelPort, Protocol):
    """What a platform adapter is given: its pipeline's events, its slash commands, and
    what it reads in listening channels (bot/channels/port.py)."""
