"""What the slash commands need of the bot: the command port. The events'
side (the pipeline's) is bot/ports.py's BotPort; the two are apart so each
caller sees only what it uses."""

from __future__ import annotations

from typing import Any, Protocol

from bot.forgetting.ledger import LedgerPage


class CommandPort(Protocol):
    """Each call acts for one person (`platform`, `user_id`): only ever on what is theirs."""

    async def memory_ledger(self, platform: str, user_id: str, page: int = 1) -> LedgerPage | None:
        """One page of the items held on this user (for /memory); None if nothing."""
        ...

    async def forget_memory_item(self, platform: str, user_id: str, item_id: str) -> str:
        """Forget one item by its ledger id; the answer to show (a receipt, or why not)."""
        ...

    async def search_memory_for(self, platform: str, user_id: str, query: str) -> str:
        """`/memory search <words>`: the person's memory searched as the agent searches it; the answer."""
        ...

    async def share_memory_item(self, platform: str, user_id: str, item_id: str) -> str:
        """Show one note (a working-context line) everywhere, the person's choice; the answer."""
        ...

    async def preview_forget_about(self, platform: str, user_id: str, about: str) -> str | None:
        """What forgetting `about` would delete, to confirm (for /forget about:); None if nothing."""
        ...

    async def forget_memories_about(self, platform: str, user_id: str, about: str) -> str:
        """Forget everything about `about`, everywhere; the receipt."""
        ...

    async def forget_user(self, platform: str, user_id: str) -> bool:
        """Delete everything held on this user (for /forget); whether there was anything."""
        ...

    async def checkin_command(self, platform: str, user_id: str, text: str, reply_to: dict[str, Any]) -> str:
        """`/checkin ...`: manage the user's scheduled check-ins; the answer to show them.
        `reply_to` is where future check-ins are delivered (usually the user's DM)."""
        ...
