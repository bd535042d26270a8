"""What the bot holds on a user, as data and as text a person reads.

Shared by `memgpt-bot memory show` and the platforms' `/memory` commands.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memory.places import DM_KEY
from memory.store import Store


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


async def describe_user(store: Store, key: str) -> dict[str, Any] | None:
    """Working context, summary and counts for the agent of `key`; None if unknown."""
    record = await store.find_agent(key)
    if record is None:
        return None
    blocks = await store.load_blocks(record.id)
    conversation = await store.get_conversation(record.id, DM_KEY)
    return {
        "user": key,
        "agent_id": record.id,
        "created_at": _iso(record.created_at),
        "working_context": {
            b.label: {"value": b.value, "limit": b.limit, "updated_at": _iso(b.updated_at)} for b in blocks
        },
        "summary": conversation.summary,
        "summary_updated_at": _iso(conversation.summary_updated_at),
        "counts": {
            "recall_messages": await store.count_messages(record.id),
            "archival_passages": await store.count_passages(record.id),
            "queue_messages": len(await store.messages_since(record.id, conversation.queue_start_seq)),
        },
    }


def render_description(description: dict[str, Any]) -> str:
    created = datetime.fromisoformat(description["created_at"])
    lines = [
        f"User {description['user']} (agent {description['agent_id']}, since {created:%Y-%m-%d %H:%M} UTC)",
        "",
        "Working context:",
    ]
    for label, block in description["working_context"].items():
        lines.append(f"  [{label}] {len(block['value'])}/{block['limit']} chars")
        lines.extend(f"    {line}" for line in (block["value"] or "(empty)").splitlines())
    lines += ["", "Summary of evicted messages:"]
    lines.extend(f"  {line}" for line in (description["summary"] or "(none yet)").splitlines())
    counts = description["counts"]
    lines += [
        "",
        f"Recall storage:   {plural(counts['recall_messages'], 'message')}",
        f"Archival storage: {plural(counts['archival_passages'], 'passage')}",
        f"Queue:            {plural(counts['queue_messages'], 'message')}",
    ]
    return "\n".join(lines)
