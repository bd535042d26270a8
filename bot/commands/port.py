"""What the slash commands need of the bot: the command port, the runtime's
calls on one person's memory by their agent key (the CLI's `memory` commands
make the same calls). The events' side (the pipeline's) is bot/ports.py's
EventPort; the two are apart so each caller sees only what it uses."""

from __future__ import annotations

from typing import Any, Protocol

from bot.channels.port import ChannelRef, Mode
from bot.forgetting.erasing import Receipt
from bot.forgetting.ledger import LedgerPage
from bot.forgetting.matching import Found


class CommandPort(Protocol):
    """Each call waits for the person's agent to be idle, and acts on what is theirs alone."""

    async def ledger(self, key: str, page: int = 1) -> LedgerPage | None:
        """One page of the items held on this person; None if nothing."""
        ...

    async def forget_one(self, key: str, item_id: str) -> Receipt:
        """Forget one item by its ledger id; UnknownItem (its message says why) when there is none."""
        ...

    async def search_memory(self, key: str, query: str) -> str:
        """The person's memory searched as the agent searches it; the answer."""
        ...

    async def share_note(self, key: str, item_id: str) -> str:
        """Show one note (a working-context line) everywhere, the person's choice; the answer."""
        ...

    async def preview_forget(self, key: str, about: str) -> Found:
        """What forgetting `about` would delete, to confirm first."""
        ...

    async def forget_topic(self, key: str, about: str) -> Receipt:
        """Forget everything about `about`, everywhere."""
        ...

    async def channel_setting(self, key: str, choice: str = "") -> str:
        """`/memory channels off|on`: whether channels may keep what the person says
        (off: recorded, then what they kept is deleted); "": the setting and what
        each channel holds of them. The answer."""
        ...

    async def forget(self, key: str) -> bool:
        """Delete everything held on this person; whether there was anything."""
        ...

    async def checkin_command(self, platform: str, user_id: str, text: str, reply_to: dict[str, Any]) -> str:
        """`/checkin ...`: manage the person's scheduled check-ins; the answer to show them.
        `reply_to` is where future check-ins are delivered (usually their DM)."""
        ...

    # /channel: a channel's mode, shown to anyone, set by who manages it (the adapter checks).
    async def channel_mode(self, channel: ChannelRef, default: Mode) -> Mode:
        """The channel's mode: what a manager set, else `default` (the operator's setting)."""
        ...

    async def set_channel_mode(self, channel: ChannelRef, mode: Mode) -> str:
        """Set the channel's mode; the notice to post in the channel when it now listens
        (said once: "" when it was said before, or for "mention")."""
        ...
