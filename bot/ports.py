"""What adapters may ask of the bot. Adapters depend on this, never on memory."""

from __future__ import annotations

from typing import Protocol

from bot.events import Event, Reply


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
