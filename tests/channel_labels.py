"""How the model reads a mention's channel context (bot/channel_context.py),
for the Discord and Slack places tests: one check for both platforms."""

from __future__ import annotations

from bot.channel_context import render_channel_context
from bot.events import UserMessage
from memory.tokens import TokenCounter, load_encoder


def who_said(event: UserMessage) -> list[str]:
    """Each channel line as the model reads it, "<who>: <text>", without its time."""
    rendered = render_channel_context(event, TokenCounter(load_encoder("test-model")), 10_000)
    header, *lines = rendered.splitlines()
    assert "Lines marked (this person) are by the person you are answering" in header
    return [line.split("] ", 1)[1] for line in lines]
