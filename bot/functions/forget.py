"""`forget_memories`: the person asks, in chat,
to have something forgotten ("forget what I told you about my diagnosis").

Two steps, so that nothing is deleted on the model's word alone:

1. `forget_memories(topic)` finds what the topic matches (bot/forgetting/),
   deletes nothing, and answers with the matches and a one-time code. The
   model shows the person what it found and asks them to confirm.
2. `forget_memories(topic, code)` deletes it, only if the code is the one
   handed out, at most CONFIRM_WITHIN later, and only while a *later* message
   of the person is being answered (their reply to the question): a model
   cannot confirm in the same chain of steps that asked. The topic is
   searched again, so what was said about it since (the request itself, the
   question) goes too; the result is a receipt with counts only.

Outside a DM the matches listed are only those that place may read, and the
receipt gives no counts: nothing said privately is named in a channel.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from bot.events import UserMessage
from bot.forgetting.ledger import describe_found
from bot.forgetting.service import find_about, forget_about, reload
from bot.functions.registry import HEARTBEAT, FunctionError, FunctionSet, function_schema
from memory.types import utc_now

if TYPE_CHECKING:
    from bot.agent import Agent

CONFIRM_WITHIN = timedelta(minutes=15)

NAME = "forget_memories"
FORGET_MEMORIES = function_schema(
    NAME,
    "Forget a topic the person asks you to. Topic alone: shows matches, deletes nothing. "
    "With the code, after their yes in a new message: deletes.",
    {
        "topic": {"type": "string", "description": "Their words plus the specifics you hold."},
        "code": {"type": "string", "description": "To confirm: the code alone."},
        "request_heartbeat": HEARTBEAT,
    },
    ["request_heartbeat"],
)


@dataclass(frozen=True, slots=True)
class Proposal:
    code: str
    topic: str
    asked_in: str  # the event whose answer showed the matches
    at: datetime


def register_forget_functions(functions: FunctionSet[Agent]) -> None:
    proposals: dict[str, Proposal] = {}  # by agent id; one open question per person

    async def forget_memories(agent: Agent, arguments: dict[str, Any]) -> str:
        if str(arguments.get("code") or "").strip():
            return await confirm(agent, arguments)
        topic = str(arguments.get("topic") or "").strip()
        if not topic:
            raise FunctionError("topic is empty: say what the person wants forgotten, in their words.")
        found = await find_about(agent.services, agent.id, topic)
        if found.empty:
            proposals.pop(agent.id, None)
            return f"Nothing held matches {topic!r}: tell the person there is nothing to forget."
        event = agent.current_event
        code = secrets.token_hex(3)
        proposals[agent.id] = Proposal(code, topic, event.event_id if event else "", utc_now())
        visible = agent.visible
        shown = replace(
            found,
            messages=[m for m in found.messages if visible.sees(m.place)],
            passages=[p for p in found.passages if visible.sees(p.place)],
            lines=[line for line in found.lines if line.shared or visible.sees(line.place)],
            summaries=[c for c in found.summaries if visible.sees(c.place)],
        )
        listing = describe_found(shown) if not shown.empty else f"Matches for {topic!r} were found."
        if not agent.place.is_dm:
            listing += " (What was said in private places is included but not listed here.)"
        return (
            f"{listing}\nNothing is deleted yet. Show the person what you found and ask whether to forget it "
            f"everywhere. Only if they say yes in their reply, call forget_memories again with code {code!r}."
        )

    async def confirm(agent: Agent, arguments: dict[str, Any]) -> str:
        proposal = proposals.get(agent.id)
        if proposal is None or str(arguments["code"]).strip() != proposal.code:
            raise FunctionError("No such code: call forget_memories with the topic alone first.")
        event = agent.current_event
        if not isinstance(event, UserMessage) or event.event_id == proposal.asked_in:
            raise FunctionError(
                "The person has not answered yet: ask them and wait for their reply; "
                "confirm with the code only after they say yes."
            )
        if utc_now() - proposal.at > CONFIRM_WITHIN:
            proposals.pop(agent.id, None)
            raise FunctionError("The code expired: call forget_memories again and ask the person once more.")
        proposals.pop(agent.id, None)
        _, receipt = await forget_about(agent.services, agent.record, proposal.topic, keep=_under_way(agent))
        await reload(agent)  # the queues, notes and counts the next requests are built from
        if agent.services.forget_in_channels is not None:  # their channel lines and notes, as /forget about: does
            agent.services.forget_in_channels(agent.record.key, proposal.topic)
        if not agent.place.is_dm:
            return "Forgotten everywhere. The person can check what is left with /memory (only they see it)."
        return receipt.text()

    functions.register(FORGET_MEMORIES, forget_memories, on_demand="forget a topic they ask you to")


def _under_way(agent: Agent) -> frozenset[int]:
    """The seq of the step calling the confirm: recorded before it runs, its
    results come after, so it stays (a result without its call is refused)."""
    for message in reversed([entry.message for entry in agent.queue.entries]):
        if message.role == "assistant" and message.calls(NAME):
            return frozenset({message.seq})
    return frozenset()
