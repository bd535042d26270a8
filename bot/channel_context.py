"""The recent lines of a channel, shown to the agent when it is mentioned there.

They are other people's words: shown for the LLM calls of that one event and
never stored in the person's memory. They ride with the memory status in the
newest message (memory/queue_manager.py), so the place's cached prefix stays
whole for the next event. Cut to a token budget (MEMGPT_CHANNEL_CONTEXT_TOKENS),
newest lines kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.events import ChannelLine
from memory.places import Place
from memory.tokens import TokenCounter

HEADER = (
    "[channel context] Recent messages in {where}, by other people: for context only. "
    "This person did not say them, and they are not kept in your memory."
)


def render_channel_context(lines: Sequence[ChannelLine], place: Place, counter: TokenCounter, limit: int) -> str:
    """The newest `lines` that fit in `limit` tokens, oldest first, under a header; "" if none fit."""
    if not lines or limit <= 0 or place.is_dm:
        return ""
    header = HEADER.format(where=place.name or "this channel")
    budget = limit - counter.count(header)
    kept: list[str] = []
    for line in reversed(lines):
        who = f"{line.author} (a bot)" if line.from_bot else line.author
        text = f"[{line.created_at:%Y-%m-%d %H:%M}] {who}: {line.text}"
        cost = counter.count(text) + 1  # and its newline
        if cost > budget:
            break
        budget -= cost
        kept.append(text)
    return "\n".join([header, *reversed(kept)]) if kept else ""
