"""The recent lines of a channel, shown to the agent when it is mentioned there.

They are context for the LLM calls of that one event and never stored in the
person's memory. Each line says who wrote it: the person asking (their own
earlier lines, which the platforms list with everyone else's: only the ones
addressed to the bot are in the queue), the bot, or someone else, so the
model is never told the person's own words are another's. They ride with the
memory status in the newest message (memory/queue_manager.py), so the place's
cached prefix stays whole for the next event. Cut to a token budget
(MEMGPT_CHANNEL_CONTEXT_TOKENS), newest lines kept.
"""

from __future__ import annotations

from bot.events import ChannelLine, UserMessage
from memory.tokens import TokenCounter

HEADER = (
    "[channel context] Recent messages in {where}, for context only; they are not kept in your memory. "
    "Lines marked (this person) are by the person you are answering; the others are by other people."
)
ASKER = "this person"


def render_channel_context(event: UserMessage, counter: TokenCounter, limit: int) -> str:
    """The newest lines before `event` that fit in `limit` tokens, oldest first, under a header; "" if none fit."""
    lines, place = event.channel_context, event.place
    if not lines or limit <= 0 or place.is_dm:
        return ""
    header = HEADER.format(where=place.name or "this channel")
    budget = limit - counter.count(header)
    kept: list[str] = []
    for line in reversed(lines):
        text = f"[{line.created_at:%Y-%m-%d %H:%M}] {_who(line, event.user_id)}: {line.text}"
        cost = counter.count(text) + 1  # and its newline
        if cost > budget:
            break
        budget -= cost
        kept.append(text)
    return "\n".join([header, *reversed(kept)]) if kept else ""


def _who(line: ChannelLine, asker: str) -> str:
    if line.from_bot:
        return f"{line.author} (a bot)"
    if line.author_id and line.author_id == asker:
        return f"{line.author} ({ASKER})"
    return line.author
