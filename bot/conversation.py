"""One place's conversation of an agent: its queue, its recursive summary, and
what may be read from there.

A person has one agent and one working context, but each place they talk to
it in (their DMs, a private channel, a public channel: memory/places.py) has
a conversation of its own, opened the first time an event happens there. Its
requests start with the same instructions, then a short "where you are" part
(who reads what the agent writes there), then working context (the lines
that place may read: memory/working_context.py), then its own summary and queue: each place keeps
a stable prefix for the provider's prompt cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memory.places import Place, Visibility
from memory.queue_manager import Eviction, QueueManager
from memory.store import Store
from memory.types import ConversationRecord, Message, utc_now
from memory.working_context import WorkingContext

if TYPE_CHECKING:
    from bot.services import AgentServices

INTERRUPTED_RESULT = (
    "Cut short by a restart: this call may or may not have taken effect. Check (working context, "
    "archival storage, reminders) before doing it again."
)
CHANNEL_RULES = "Never bring up what the person told you privately."


def place_instructions(instructions: str, place: Place) -> str:
    """The read-only part of a place's system text: the instructions, then where the agent is."""
    where = f"In {place.describe()}" if place.is_dm else f"In {place.describe()} {CHANNEL_RULES}"
    return f"{instructions}\n## Where you are\n{where}"


@dataclass(slots=True)
class Conversation:
    """A place's queue and summary, and the counts its memory status shows
    (of what that place may read)."""

    place: Place
    visible: Visibility  # of the place: what reads made there may return
    record: ConversationRecord
    queue: QueueManager
    recall_count: int
    archival_count: int
    # The channel's notes (bot/channels/notes.py) as this prompt's working context
    # holds them, shown or staged; and as its system message shows them (None: not
    # yet put in since the conversation opened). "" and None in a DM.
    notes: str = ""
    notes_shown: str | None = None
    notes_of: str = ""  # the channel key they are of

    async def flushed(self, store: Store, eviction: Eviction) -> None:
        """Keep an eviction (its new summary, where the queue now starts), then apply it."""
        now = utc_now()
        await store.update_queue(
            self.record.agent_id, eviction.summary, eviction.new_start_seq, now, place=self.place.key
        )
        self.queue.apply(eviction)
        self.record.summary, self.record.queue_start_seq = eviction.summary, eviction.new_start_seq
        self.record.summary_updated_at = now

    def show(self, working_context: WorkingContext, *, edited_here: bool = False) -> None:
        """Put the working context, as this place may see it, into its prompt:
        at the next flush for an edit made here (the model reads it in this
        queue meanwhile, and the cached prefix stays whole), at once elsewhere."""
        rendered = self.rendered(working_context)
        if edited_here:
            self.queue.stage_working_context(rendered)
        else:
            self.queue.set_working_context(rendered)

    def rendered(self, working_context: WorkingContext) -> str:
        """The working context as this place shows it: its blocks, then a channel's notes."""
        blocks = working_context.render(self.place)
        return f"{blocks}\n{self.notes}" if self.notes else blocks


async def open_conversation(
    services: AgentServices, agent_id: str, place: Place, working_context: WorkingContext
) -> tuple[Conversation, list[Message]]:
    """The conversation of `place` as stored, with its queue's messages (the
    caller closes the function calls a crash left open among them)."""
    store = services.store
    record = await store.get_conversation(agent_id, place.key, place.name)
    messages = await store.messages_since(agent_id, record.queue_start_seq, place=place.key)
    visible = Visibility.of(place)
    conversation = Conversation(
        place,
        visible,
        record,
        new_queue(services, place_instructions(services.instructions, place)),
        recall_count=await store.count_messages(agent_id, visible=visible),
        archival_count=await store.count_passages(agent_id, visible=visible),
    )
    conversation.queue.load(record.summary, messages, working_context.render(place))
    return conversation, messages


def new_queue(services: AgentServices, instructions: str) -> QueueManager:
    return QueueManager(
        services.counter,
        instructions,
        services.functions.schemas,
        services.context_window,
        more_tools=services.functions.on_demand_schemas,
        more_tools_after=services.functions.on_demand_triggers,
        warning_threshold=services.warning_threshold,
        flush_threshold=services.flush_threshold,
        evict_fraction=services.evict_fraction,
        response_reserve=services.response_reserve,
        max_item_tokens=services.max_message_tokens,
        queue_tokens=services.queue_tokens,
    )


def interrupted_calls(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The function calls of the last step that have no result: only a crash
    between recording a step's calls and their results leaves any."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant" and message.tool_calls:
            answered = {later.tool_call_id for later in messages[index + 1 :] if later.role == "tool"}
            return [call for call in message.tool_calls if call.get("id") not in answered]
    return []
