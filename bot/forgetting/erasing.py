"""Deleting what a topic matched, everywhere it lives, and the receipt.

Messages and passages go from the store with their keyword-index entries and
embeddings (and, on SQLite, an ANN file that held one of the vectors is
dropped and rebuilt from the rows left: memory/sqlite/store.py). Lines go from
their blocks. A summary that mentions the topic is rewritten by the LLM, told
to drop it; the rewrite is checked (none of the topic's words, no sentence
close to it in meaning) and, if it fails the check or the LLM cannot be
reached, the summary loses the sentences about the topic instead. Last, the
store's own files are made to forget too (flush_deleted).

The inbox and the outbox hold the words too: each event's platform payload
and each reply's text, kept a day after the event finished (its id drops a
repeat delivery). Every forget, of a topic or of one item, empties the payload
of each finished event of the person and the text of each reply sent or
dropped, whatever matched (Store.inbox_scrub): a payload is platform JSON
and a reply may be cut in pieces, where matching could miss the topic, and
these copies serve only to recognise an id, so the stricter rule costs
nothing. An unfinished event (its replay needs the payload) and a reply not
yet sent keep theirs: under the forget's turn and lease none of the person's
events is running, so those are messages still to be answered, as a message
sent after the forget would be. The event that asked the agent to forget
(forget_memories) is finished after its own forget: the next forget, or the
day's sweep, takes its words.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from bot.forgetting.matching import Found, Matcher, sentences
from bot.llm import LLMClient, Request
from bot.reports import plural
from memory.store import Store
from memory.types import utc_now
from memory.working_context import forget_lines

log = logging.getLogger(__name__)

REWRITE_INSTRUCTIONS = """\
You edit the running summary of a conversation between an agent and a person. The person asked \
the agent to forget everything about this topic: {about}. Rewrite the summary without anything \
about it (no facts, mentions or hints), and keep everything else as it is. Reply with the \
summary text only."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """How many items of each kind were removed."""

    messages: int = 0
    passages: int = 0
    notes: int = 0
    summaries: int = 0
    channel_lines: int = 0  # what channel memories kept of the person
    channel_notes: int = 0  # channel notes credited to them

    @property
    def nothing(self) -> bool:
        own = self.messages or self.passages or self.notes or self.summaries
        return not (own or self.channel_lines or self.channel_notes)

    def text(self) -> str:
        if self.nothing:
            return "Nothing matched, so nothing was deleted."
        summaries = "1 summary" if self.summaries == 1 else f"{self.summaries} summaries"
        channels = ""
        if self.channel_lines or self.channel_notes:
            channels = (
                f"; from channel memories, {plural(self.channel_lines, 'message')} of yours "
                f"and {plural(self.channel_notes, 'note')} credited to you"
            )
        return (
            f"Forgotten: {plural(self.messages, 'message')}, {plural(self.passages, 'saved passage')}, "
            f"{plural(self.notes, 'note')} from working context; {summaries} rewritten{channels}."
        )


async def erase(
    store: Store, llm: LLMClient, matcher: Matcher, agent_id: str, found: Found, model: str = ""
) -> Receipt:
    """Delete everything in `found` and rewrite the summaries that mention it."""
    messages = await store.delete_messages(agent_id, [message.seq for message in found.messages])
    passage_ids = [passage.id for passage in found.passages]
    await store.delete_passages(agent_id, passage_ids)
    notes = await _drop_lines(store, agent_id, found)
    for conversation in found.summaries:
        summary = await rewrite_summary(llm, matcher, conversation.summary, model)
        await store.update_queue(agent_id, summary, conversation.queue_start_seq, utc_now(), place=conversation.place)
        conversation.summary = summary
    await store.flush_deleted()
    return Receipt(messages, len(passage_ids), notes, len(found.summaries))


async def _drop_lines(store: Store, agent_id: str, found: Found) -> int:
    gone: dict[str, set[str]] = defaultdict(set)
    for line in found.lines:
        gone[line.label].add(line.id)
    for label, ids in gone.items():
        await forget_lines(store, agent_id, label, ids)
    return len(found.lines)


async def rewrite_summary(llm: LLMClient, matcher: Matcher, summary: str, model: str = "") -> str:
    """`summary` without the topic: the LLM's rewrite if it passes the check, else the sentences left."""
    messages = [
        {"role": "system", "content": REWRITE_INSTRUCTIONS.format(about=matcher.about)},
        {"role": "user", "content": summary},
    ]
    try:
        completion = await llm.complete(Request(messages, model=model or None))
        rewritten = (completion.content or "").strip()
    except Exception as error:  # the LLM down or refusing: the sentences still go
        log.warning("summary rewrite failed, removing the sentences instead: %s", error)
        rewritten = ""
    if rewritten and not await matcher.mentioned_in(rewritten):
        return rewritten
    about = set(await matcher.mentioned_in(summary))
    return " ".join(sentence for sentence in sentences(summary) if sentence not in about)
