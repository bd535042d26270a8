"""What the bot holds on a user, as data and as text a person reads.

Shared by `memgpt-bot memory show` and the platforms' `/memory` commands. It
says what is kept privately (the DM conversation, the private block, what was
saved in DMs: only the person's DMs see it) and what each channel holds (seen
there, in the person's DMs, and, for a public channel, everywhere).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memory.places import DM_KEY, Place, Visibility
from memory.store import Store
from memory.working_context import PRIVATE_BLOCK


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def only(key: str) -> Visibility:
    """The items recorded in conversation `key` and no other."""
    return Visibility(everything=False, places=frozenset({key}), public=False)


async def describe_user(store: Store, key: str) -> dict[str, Any] | None:
    """Working context, conversations and counts for the agent of `key`; None if unknown."""
    record = await store.find_agent(key)
    if record is None:
        return None
    blocks = await store.load_blocks(record.id)
    conversations = {c.place: c for c in await store.list_conversations(record.id)}
    if DM_KEY not in conversations:
        conversations[DM_KEY] = await store.get_conversation(record.id, DM_KEY)
    places = []
    for place in sorted(conversations, key=lambda k: (k != DM_KEY, k)):
        conversation = conversations[place]
        places.append(
            {
                "place": place,
                "name": conversation.name or Place.from_key(place).name,
                "summary": conversation.summary,
                "summary_updated_at": _iso(conversation.summary_updated_at),
                "queue_start_seq": conversation.queue_start_seq,
                "queue_messages": len(await store.messages_since(record.id, conversation.queue_start_seq, place=place)),
                "messages": await store.count_messages(record.id, visible=only(place)),
                "passages": await store.count_passages(record.id, visible=only(place)),
            }
        )
    dm = places[0]
    return {
        "user": key,
        "agent_id": record.id,
        "created_at": _iso(record.created_at),
        "working_context": {
            b.label: {"value": b.value, "limit": b.limit, "updated_at": _iso(b.updated_at)} for b in blocks
        },
        # The DM conversation's: the summary the person's own chats build on.
        "summary": dm["summary"],
        "summary_updated_at": dm["summary_updated_at"],
        "conversations": places,
        "counts": {
            "recall_messages": await store.count_messages(record.id),
            "archival_passages": await store.count_passages(record.id),
            "queue_messages": dm["queue_messages"],
        },
    }


def _where(conversation: dict[str, Any]) -> str:
    place = Place.from_key(conversation["place"], conversation["name"])
    if place.is_dm:
        return "Direct messages (private: only your DMs with me see this)"
    label = place.name or place.id
    if place.kind == "private":
        return f"Private channel {label} (seen there and in your DMs)"
    return f"Public channel {label} (shared: seen wherever you talk to me)"


def render_description(description: dict[str, Any]) -> str:
    created = datetime.fromisoformat(description["created_at"])
    lines = [
        f"User {description['user']} (agent {description['agent_id']}, since {created:%Y-%m-%d %H:%M} UTC)",
        "",
        "Working context (persona and human: every place; private: only your DMs):",
    ]
    for label, block in description["working_context"].items():
        note = " (private)" if label == PRIVATE_BLOCK else ""
        lines.append(f"  [{label}]{note} {len(block['value'])}/{block['limit']} chars")
        lines.extend(f"    {line}" for line in (block["value"] or "(empty)").splitlines())
    for conversation in description.get("conversations", []):
        lines += [
            "",
            f"{_where(conversation)} [{conversation['place']}]:",
            f"  {plural(conversation['messages'], 'message')} ({conversation['queue_messages']} in the queue), "
            f"{plural(conversation['passages'], 'saved passage')}",
            "  Summary of evicted messages:",
        ]
        lines.extend(f"    {line}" for line in (conversation["summary"] or "(none yet)").splitlines())
    counts = description["counts"]
    lines += [
        "",
        f"Recall storage:   {plural(counts['recall_messages'], 'message')}",
        f"Archival storage: {plural(counts['archival_passages'], 'passage')}",
        f"Queue:            {plural(counts['queue_messages'], 'message')} (direct messages)",
    ]
    return "\n".join(lines)
