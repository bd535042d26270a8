"""The bot's side of listening channels (bot/channels/port.py ChannelPort): a
channel's mode, and the lines the platform reports there kept in that
channel's memory (memory/channels.py), unless their speaker opted out.

Listening never makes an LLM call and never touches anyone's agent: a heard
line goes to the channel's own memory (one append; its embedding is done
later, in batches, off the event loop). What a busy channel would otherwise
ask of the store on every message (its mode, whether its notice was said,
each speaker's consent) is cached here for a few seconds; a mode set in this
process is seen at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from cachetools import TTLCache

from bot.channels.port import MODES, ChannelRef, Heard, Mode
from bot.events import agent_key
from memory.channels import ChannelMemory
from memory.types import ChannelLine, utc_now

log = logging.getLogger(__name__)

# Seconds a channel's stored mode, and whether its notice was said, are trusted
# without asking the store again: a mode another process set is seen within this.
MODE_TTL = 15.0
# Seconds a speaker's consent is trusted before a line of theirs is appended (after it,
# the store is asked: ChannelMemory.keep_with_consent): an opt-out costs no append after this.
CONSENT_TTL = 5.0

LISTENING_NOTICE = (
    "From now on I keep what is said in this channel, for this channel only, so that members can "
    "ask me about it here later; nothing of it is read anywhere else. To keep your own messages out "
    "(and delete what I kept of them), use `/memory channels off`. Keeping them makes no AI call: "
    "I read nothing into anyone's conversation with me."
)


class ChannelListener:
    """Serves ChannelPort over one ChannelMemory, and `set_mode` for /channel."""

    def __init__(self, memory: ChannelMemory, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.memory = memory
        self.store = memory.store
        # channel key -> the stored mode (None: the operator's setting holds).
        self._modes: TTLCache[str, str | None] = TTLCache(10_000, ttl=MODE_TTL, timer=clock)
        # channel key -> its notice was said (by this process or another).
        self._noticed: TTLCache[str, bool] = TTLCache(10_000, ttl=MODE_TTL, timer=clock)
        # speaker agent key -> whether channels may keep what they say.
        self._consent: TTLCache[str, bool] = TTLCache(50_000, ttl=CONSENT_TTL, timer=clock)

    # -- modes -------------------------------------------------------------------
    async def channel_mode(self, channel: ChannelRef, default: Mode) -> Mode:
        key = channel.key
        if key in self._modes:
            stored = self._modes[key]
        else:
            stored = self._modes[key] = await self.store.channel_mode(key)
        return stored if stored in MODES else default

    async def set_mode(self, channel: ChannelRef, mode: Mode) -> str:
        """Set the channel's mode (a manager's /channel); the notice to post in the channel
        when it now listens and this is the one process to say so, else ""."""
        key = channel.key
        await self.store.set_channel_mode(key, mode, utc_now())
        self._modes[key] = mode
        self._noticed.pop(key, None)
        log.info("%s: channel %s set to %s", channel.platform, key, mode)
        return "" if mode == "mention" else await self._notice(channel)

    async def _notice(self, channel: ChannelRef) -> str:
        key = channel.key
        if self._noticed.get(key):
            return ""
        claimed = await self.store.claim_channel_notice(key, utc_now())
        self._noticed[key] = True
        return LISTENING_NOTICE if claimed else ""

    # -- what the platform reports ---------------------------------------------
    async def hear(self, heard: Heard) -> str:
        speaker = agent_key(heard.channel.platform, heard.user_id)
        if heard.text.strip() and await self._consents(speaker):
            line = ChannelLine(
                channel=heard.channel.key,
                message_id=heard.message_id,
                speaker=speaker,
                speaker_name=heard.speaker_name,
                text=heard.text,
                said_at=heard.said_at,
                place=heard.channel.place.key,
            )
            # Kept once (a repeat is not); the store's consent is read again after the append,
            # so an opt-out made meanwhile, here or in another process, takes the line out.
            if not await self.memory.keep_with_consent(line, asked=True):
                self._consent.pop(speaker, None)
        return await self._notice(heard.channel)

    async def heard_edit(self, channel: ChannelRef, message_id: str, text: str, edited_at: datetime) -> None:
        await self.memory.edit(channel.key, message_id, text, edited_at)

    async def heard_delete(self, channel: ChannelRef, message_id: str) -> None:
        await self.memory.delete(channel.key, message_id)

    # -- consent -------------------------------------------------------------------
    async def _consents(self, speaker: str) -> bool:
        known = self._consent.get(speaker)
        if known is None:
            chosen = await self.memory.consent([speaker])
            known = self._consent[speaker] = chosen.get(speaker, True)  # keeping is the default
        return known

    def consent_changed(self, speaker: str) -> None:
        """`speaker` chose again (/memory channels): the next line of theirs asks the store."""
        self._consent.pop(speaker, None)
