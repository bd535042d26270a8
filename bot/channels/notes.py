"""A channel's notes in the prompts of whoever's agent answers there, and their
edits through core_memory_append / core_memory_replace (name `channel`).

Where shown. In the working context of an agent's conversation of that
channel (its threads included), after its own blocks: never in a DM (a DM
has no channel) nor in another channel (the notes are the event's channel's,
memory/channel_notes.py, never a model's argument).

Cacheable prompts, as for the other blocks (memory/queue_manager.py). The
notes go into a conversation's system message when it opens; later, a change
(this agent's edit, or another member's agent's) is staged for the next cut of
the queue, when the system message is rewritten anyway, so the prefix the
provider cached stays whole. Meanwhile the model reads the change: its own
edit as the function's result, and on each event in that channel the lines
added or removed since the system message showed them ride with the memory
status (for that event's requests only, like the channel's recent lines).
Another member's edit is seen on the next event here: every agent of the
process reads the same cached copy (memory/channel_notes.py: ChannelNotes).
"""

from __future__ import annotations

from typing import Protocol

from bot.channels.recall import channel_of
from bot.conversation import Conversation
from bot.events import Event, UserMessage
from bot.functions.registry import FunctionError
from bot.services import AgentServices
from memory.channel_notes import EMPTY, Edit, notes_size, render_notes
from memory.places import Place
from memory.working_context import MemoryEditError, WorkingContext

NEWS = "[channel notes] Changed since the channel block above showed them (+ added, - gone):"
NOT_HERE = "The channel block exists only in a channel (not in a DM); save this in human or archival storage."


class Answering(Protocol):
    """What the notes need of the agent answering (bot/agent.py), which imports this module."""

    services: AgentServices
    working_context: WorkingContext
    current_event: Event | None

    @property
    def conversation(self) -> Conversation: ...

    @property
    def place(self) -> Place: ...


async def channel_news(agent: Answering, event: Event, context: str) -> str:
    """Put the current notes of the event's channel into the conversation's
    working context (see the module's docstring); `context` (the channel's
    recent lines, for the memory status) with the change the system message
    does not show yet after it."""
    notes = agent.services.channel_notes
    channel = channel_of(event)
    if notes is None or channel is None:
        return context
    current = render_notes(await notes.read(channel), notes.limit)
    news = refreshed(agent.conversation, agent.working_context, channel, current)
    return "\n".join(part for part in (context, news) if part)


def refreshed(conversation: Conversation, working_context: WorkingContext, channel: str, current: str) -> str:
    queue = conversation.queue
    if conversation.notes_shown is None or conversation.notes_of != channel:
        # Its first event since it opened: into the system message now. So too when the
        # place's id is another workspace's channel (the conversation is the place's):
        # nothing of the other channel's notes may be shown, not even as gone.
        conversation.notes = conversation.notes_shown = current
        conversation.notes_of = channel
        queue.set_working_context(conversation.rendered(working_context))
        return ""
    if queue.staged_working_context is None:  # nothing waits for a cut: the system message shows the latest
        conversation.notes_shown = conversation.notes
    if current != conversation.notes:
        conversation.notes = current
        conversation.show(working_context, edited_here=True)
        if queue.staged_working_context is None:
            conversation.notes_shown = current
    return changes(conversation.notes_shown, current)


def changes(shown: str, current: str) -> str:
    """The lines of `current` notes that `shown` lacks (+) and has beyond them (-)."""
    if shown == current:
        return ""
    before, after = _body(shown), _body(current)
    added = [f"+ {line}" for line in after if line not in before]
    gone = [f"- {line}" for line in before if line not in after]
    return "\n".join([NEWS, *added, *gone]) if added or gone else ""


def _body(rendered: str) -> list[str]:
    return [line for line in rendered.split("\n")[1:-1] if line != EMPTY]  # between the block's tags


async def edit_channel_notes(agent: Answering, edit: Edit) -> str:
    """Make `edit` on the notes of the current event's channel, the lines it
    writes credited to the person answered; the result's words for the model."""
    notes, event = agent.services.channel_notes, agent.current_event
    channel = channel_of(event)
    if notes is None or channel is None or not isinstance(event, UserMessage):
        raise FunctionError(NOT_HERE)
    name = event.display_name or event.user_id
    try:
        block = await notes.edit(channel, edit, agent.place, event.agent_key, name)
    except MemoryEditError as error:
        raise FunctionError(str(error)) from None
    conversation = agent.conversation
    conversation.notes = render_notes(block, notes.limit)
    conversation.show(agent.working_context, edited_here=True)
    where = agent.place.name or "this channel"
    size = f"{notes_size(block)}/{notes.limit}"
    return f"channel: {size} chars. Shown to every member's agent in {where}, credited to {name}."
