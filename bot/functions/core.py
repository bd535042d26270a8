"""The core functions: each one's schema (what the model is told) beside its
body (what it does, on one agent's memory).

None of them takes an agent or user id: a function can only ever reach the
memory of the agent that called it. The schemas go out in CORE_FUNCTIONS order
with every request, so that order is part of the prompt: keep it stable.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from bot.channels.notes import edit_channel_notes
from bot.channels.recall import SPEAKERS_NOTE, channel_of, kept_text, line_text, search_both
from bot.functions.registry import (
    HEARTBEAT,
    PAGE,
    FunctionError,
    FunctionSet,
    Implementation,
    ShownNow,
    function_schema,
)
from memory.channel_notes import NOTES_BLOCK
from memory.places import DM_KEY
from memory.types import Block, Message, Passage
from memory.working_context import MemoryEditError

if TYPE_CHECKING:
    from bot.agent import Agent

MAX_ARCHIVAL_INSERT_CHARS = 8_000
# A shortened result keeps at least this much: enough for a UUID and its context.
MIN_ITEM_TOKENS = 40

BLOCK_NAME = {"type": "string", "description": "persona, human, private (DMs only) or channel (its shared notes)"}


SEND_MESSAGE = function_schema(
    "send_message",
    "The only way the person sees what you write.",
    {"message": {"type": "string", "description": "In their language."}},
    ["message"],
)


async def send_message(agent: Agent, args: dict[str, Any]) -> str:
    text = args["message"].strip()
    if not text:
        raise FunctionError("message is empty; write something for the person to read.")
    await agent.send(text)
    return ""  # {"status": "OK"} says it was sent


# Lines written in a DM (or a private channel) are shown only where they may be read;
# this shows the lines an edit touches everywhere: a line replaced by itself is shared
# (memory/working_context.py).
EVERYWHERE = {"type": "boolean", "description": "Show in every place (only if they ask)."}

CORE_MEMORY_APPEND = function_schema(
    "core_memory_append",
    "Append a line to a block.",
    {"name": BLOCK_NAME, "content": {"type": "string"}, "request_heartbeat": HEARTBEAT},
    ["name", "content", "request_heartbeat"],
)


async def core_memory_append(agent: Agent, args: dict[str, Any]) -> str:
    if args["name"] == NOTES_BLOCK and not agent.place.is_dm:  # the channel's notes, not the agent's
        content = args["content"]
        return "Appended. " + await edit_channel_notes(
            agent, lambda notes: notes.append(NOTES_BLOCK, content, agent.place)
        )
    context = agent.working_context
    block = _edited(lambda: context.append(args["name"], args["content"], agent.place))
    await agent.save_block(block)
    return f"Appended. {block.label}: {context.usage(block.label, agent.place)} chars.{_where_shown(agent)}"


CORE_MEMORY_REPLACE = function_schema(
    "core_memory_replace",
    "Replace exact text in a block; empty new_content deletes it.",
    {
        "name": BLOCK_NAME,
        "old_content": {"type": "string"},
        "new_content": {"type": "string"},
        "everywhere": EVERYWHERE,
        "request_heartbeat": HEARTBEAT,
    },
    ["name", "old_content", "new_content", "request_heartbeat"],
)


async def core_memory_replace(agent: Agent, args: dict[str, Any]) -> str:
    context, everywhere = agent.working_context, bool(args.get("everywhere", False))
    old, new = args["old_content"], args["new_content"]
    if args["name"] == NOTES_BLOCK and not agent.place.is_dm:  # shown in this channel only: `everywhere` is moot
        edit = await edit_channel_notes(agent, lambda notes: notes.replace(NOTES_BLOCK, old, new, agent.place))
        return "Replaced. " + edit
    block = _edited(lambda: context.replace(args["name"], old, new, agent.place, everywhere=everywhere))
    await agent.save_block(block)
    shown = "" if everywhere else _where_shown(agent)
    return f"Replaced. {block.label}: {context.usage(block.label, agent.place)} chars.{shown}"


def _where_shown(agent: Agent) -> str:
    """Where a line written from here is shown, for a place that does not show it everywhere."""
    if agent.place.is_dm:
        return " Shown in DMs only (everywhere=true on core_memory_replace shares it, if the person asks)."
    if agent.place.kind == "private":
        return " Shown in this channel and DMs only."
    return ""


def _edited(edit: Callable[[], Block]) -> Block:
    """The block an edit makes, or its refusal as the model's error."""
    try:
        return edit()
    except MemoryEditError as error:
        raise FunctionError(str(error)) from None


ARCHIVAL_MEMORY_INSERT = function_schema(
    "archival_memory_insert",
    "Save a self-contained passage to archival storage.",
    {"content": {"type": "string"}, "request_heartbeat": HEARTBEAT},
    ["content", "request_heartbeat"],
)


async def archival_memory_insert(agent: Agent, args: dict[str, Any]) -> str:
    content = args["content"].strip()
    if not content:
        raise FunctionError("content is empty.")
    if len(content) > MAX_ARCHIVAL_INSERT_CHARS:
        raise FunctionError(
            f"content is {len(content)} characters; save at most {MAX_ARCHIVAL_INSERT_CHARS} per call "
            "(split it into several self-contained passages)."
        )
    await agent.save_passages([Passage(text=content, source="agent")])
    return ""  # {"status": "OK"}: saved (the memory status counts the passages)


ARCHIVAL_MEMORY_SEARCH = function_schema(
    "archival_memory_search",
    "Search archival storage by meaning, best first.",
    {"query": {"type": "string"}, "page": PAGE, "request_heartbeat": HEARTBEAT},
    ["query", "request_heartbeat"],
)


async def archival_memory_search(agent: Agent, args: dict[str, Any]) -> str:
    query, page = _query_and_page(args)
    size = agent.services.search_page_size
    found = await agent.services.archival.search(agent.id, query, size, page * size, visible=agent.visible)
    items = [_passage_line(passage, score) for passage, score in found.items]
    return _page_text(agent, "archival storage", query, page, size, found.total, items)


CONVERSATION_SEARCH = function_schema(
    "conversation_search",
    "Search past messages (recall storage), best first.",
    {"query": {"type": "string"}, "page": PAGE, "request_heartbeat": HEARTBEAT},
    ["query", "request_heartbeat"],
)


async def conversation_search(agent: Agent, args: dict[str, Any]) -> str:
    query, page = _query_and_page(args)
    size = agent.services.search_page_size
    if not agent.place.is_dm and agent.services.channels is not None:  # a DM never enters channel code
        channel = channel_of(agent.current_event)
        if channel is not None:
            return await _search_with_channel(agent, channel, query, page, size)
    # By meaning and keywords; the agent's messages are embedded on its first searches (memory/recall.py).
    found = await agent.services.recall.search(agent.id, query, size, page * size, visible=agent.visible)
    items = [_elsewhere(agent, message.place) + _message_line(message) for message in found.items]
    return _page_text(agent, "recall storage", query, page, size, found.total, items)


async def _search_with_channel(agent: Agent, channel: str, query: str, page: int, size: int) -> str:
    """Recall and the channel's memory in one ranking (bot/channels/recall.py): shown now, each
    channel line naming its speaker; the agent's recall keeps the result without them."""
    event, services = agent.current_event, agent.services
    assert event is not None and services.channels is not None
    found = await search_both(
        services.recall,
        services.channels,
        agent_id=agent.id,
        visible=agent.visible,
        channel=channel,
        event=event,
        query=query,
        page=page,
        size=size,
    )
    where = agent.place.name or "this channel"
    shown, kept = [], []
    for item in found.items:
        if isinstance(item, Message):
            shown.append(_elsewhere(agent, item.place) + _message_line(item))
            kept.append(shown[-1])
        else:
            shown.append(line_text(item, agent.record.key, where))
            kept.append(kept_text(where))
    label = f"recall storage and {where}'s memory"
    text = _page_text(agent, label, query, page, size, found.total, shown)
    if any(not isinstance(item, Message) for item in found.items):
        text += "\n" + SPEAKERS_NOTE.format(where=where)
    return ShownNow(text, _page_text(agent, label, query, page, size, found.total, kept))


CONVERSATION_SEARCH_DATE = function_schema(
    "conversation_search_date",
    "List past messages between two dates, oldest first.",
    {
        "start_date": {"type": "string", "description": "YYYY-MM-DD (or ISO time), inclusive."},
        "end_date": {"type": "string", "description": "YYYY-MM-DD (or ISO time), inclusive."},
        "page": PAGE,
        "request_heartbeat": HEARTBEAT,
    },
    ["start_date", "end_date", "request_heartbeat"],
)


async def conversation_search_date(agent: Agent, args: dict[str, Any]) -> str:
    start = parse_date(args["start_date"], end=False)
    end = parse_date(args["end_date"], end=True)
    if end <= start:
        raise FunctionError("end_date must not be before start_date.")
    page = int(args.get("page", 0))
    size = agent.services.search_page_size
    found = await agent.store.messages_between(agent.id, start, end, size, page * size, visible=agent.visible)
    items = [_elsewhere(agent, message.place) + _message_line(message) for message in found.items]
    label = f"{args['start_date']} to {args['end_date']}"
    return _page_text(agent, "recall storage", label, page, size, found.total, items)


# In the order the model is shown them; the last, which few messages need, on demand (bot/functions/registry.py).
CORE_FUNCTIONS: list[tuple[dict[str, Any], Implementation[Agent]]] = [
    (SEND_MESSAGE, send_message),
    (CORE_MEMORY_APPEND, core_memory_append),
    (CORE_MEMORY_REPLACE, core_memory_replace),
    (CONVERSATION_SEARCH, conversation_search),
    (ARCHIVAL_MEMORY_INSERT, archival_memory_insert),
    (ARCHIVAL_MEMORY_SEARCH, archival_memory_search),
]


def build_core_functions() -> FunctionSet[Agent]:
    functions: FunctionSet[Agent] = FunctionSet()
    for schema, implementation in CORE_FUNCTIONS:
        functions.register(schema, implementation)
    functions.register(CONVERSATION_SEARCH_DATE, conversation_search_date, on_demand="messages by date")
    return functions


# -- helpers ---------------------------------------------------------------
def _query_and_page(args: dict[str, Any]) -> tuple[str, int]:
    query = args["query"].strip()
    if not query:
        raise FunctionError("query is empty.")
    return query, int(args.get("page", 0))


def parse_date(text: str, *, end: bool) -> datetime:
    """YYYY-MM-DD (a whole day, UTC) or an ISO time. `end` dates are inclusive,
    so a bare end date means up to the end of that day."""
    raw = text.strip()
    try:
        if len(raw) == 10:
            day = datetime.strptime(raw, "%Y-%m-%d").date()
            moment = datetime.combine(day, time.min, tzinfo=UTC)
            return moment + timedelta(days=1) if end else moment
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise FunctionError(f"Cannot read the date {text!r}; use YYYY-MM-DD.") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment + timedelta(microseconds=1) if end else moment


def _elsewhere(agent: Agent, key: str) -> str:
    """ "(in #general) " for a message said in another place than the current one; "" for this one."""
    if key == agent.place.key:
        return ""
    if key == DM_KEY:
        return "(in a DM) "
    opened = agent.conversations.get(key)
    return f"(in {opened.place.name if opened and opened.place.name else key}) "


def _message_line(message: Message) -> str:
    stamp = message.created_at.strftime("%Y-%m-%d %H:%M")
    if message.tool_calls:
        calls = ", ".join(c.get("function", {}).get("name", "?") for c in message.tool_calls)
        body = f"(called {calls}) {message.content or ''}".strip()
        for call in message.tool_calls:
            function = call.get("function", {})
            if function.get("name") == "send_message":
                body = f"said: {function.get('arguments', '')}"
        return f"[{stamp}] agent {body}"
    if message.role == "user" and (message.content or "").startswith(f"[{stamp}"):
        return message.content or ""  # an event's line opens with its time and who spoke
    return f"[{stamp}] {message.role}: {message.content}"


def _passage_line(passage: Passage, score: float) -> str:
    origin = passage.source or "archival"
    collection = getattr(passage, "collection", None)
    if collection:  # a shared collection attached to this agent, read-only
        origin = f"collection {collection}: {origin}"
    if passage.position:
        origin += f", {passage.position}"
    return f"[{passage.created_at:%Y-%m-%d}] ({origin}; relevance {score:.2f}) {passage.text}"


def _page_text(agent: Agent, where: str, query: str, page: int, size: int, total: int, items: list[str]) -> str:
    pages = max(1, -(-total // size))
    if not items:
        if total and page >= pages:
            return f"No page {page} for {query!r} in {where}: {total} results on pages 0-{pages - 1}."
        return f"Nothing found for {query!r} in {where}."
    counter = agent.services.counter
    first = page * size + 1
    remaining = max(0, total - page * size - len(items))
    more = f" {remaining} more: call again with page={page + 1}." if remaining else " No more results."
    header = (
        f"Page {page} of pages 0-{pages - 1}: results {first}-{first + len(items) - 1} of {total} "
        f"from {where} for {query!r}.{more}"
    )
    # The header and each line's "- " come out of the same budget as the items.
    room = agent.conversation.queue.page_budget(agent.status_line()) - counter.count(header) - 4 * len(items) - 40
    fit = max(1, min(len(items), room // MIN_ITEM_TOKENS))
    if fit < len(items):
        # Too little room for every result of the page: show fewer, say so, never cut them to nothing.
        header += (
            f" Only the first {fit} of this page fit in your context now; the other {len(items) - fit} "
            "were left out: search more specifically to see them."
        )
        items = items[:fit]
    per_item = max(MIN_ITEM_TOKENS, room // fit)
    shown = []
    for item in items:
        tokens = counter.count(item)
        if tokens > per_item:
            note = f" [... shortened from {tokens} tokens]"
            item = counter.truncate(item, per_item - counter.count(note)) + note
        shown.append(f"- {item}")
    return header + "\n" + "\n".join(shown)
