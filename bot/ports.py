"""What adapters may ask of the bot. Adapters depend on this, never on memory."""

from __future__ import annotations

from typing import Any, Protocol

from bot.events import Event, Reply
from memory.documents import SUPPORTED_SUFFIXES

# File name endings the bot can read from an upload (text, Markdown, HTML, PDF),
# so adapters can refuse other files before downloading them.
READABLE_SUFFIXES: frozenset[str] = frozenset(SUPPORTED_SUFFIXES)


class BotPort(Protocol):
    async def handle(self, event: Event) -> list[Reply]:
        """Run the event through the sender's agent; the replies to deliver."""
        ...

    async def memory_report(self, platform: str, user_id: str) -> str | None:
        """Text describing what the bot holds on this user (for /memory); None if nothing."""
        ...

    async def forget_user(self, platform: str, user_id: str) -> bool:
        """Delete everything held on this user (for /forget); whether there was anything."""
        ...

    async def checkin_command(self, platform: str, user_id: str, text: str, reply_to: dict[str, Any]) -> str:
        """`/checkin ...`: manage the user's scheduled check-ins; the answer to show them.
        `reply_to` is where future check-ins are delivered (usually the user's DM)."""
        ...
