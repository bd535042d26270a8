"""Selective forget for one agent: find what a topic matches, erase it, and
bring a loaded agent up to date (its queues, working context and counts are
read again from the store, so no later request carries what went)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bot.conversation import open_conversation
from bot.forgetting.erasing import Receipt, erase
from bot.forgetting.matching import Found, Matcher, find
from memory.types import AgentRecord, Message, Passage
from memory.working_context import WorkingContext

if TYPE_CHECKING:
    from bot.agent import Agent
    from bot.services import AgentServices


async def find_about(services: AgentServices, agent_id: str, about: str) -> Found:
    """What `about` matches in the agent's memory, everywhere (no place filter)."""
    store = services.store
    await services.archival.settle(agent_id)

    async def recall(query: str, limit: int, offset: int) -> Sequence[Message]:
        return list((await services.recall.search(agent_id, query, limit, offset)).items)

    async def archival(query: str, limit: int, offset: int) -> Sequence[Passage]:
        if not await store.count_passages(agent_id):
            return []
        return [passage for passage, _ in (await services.archival.search(agent_id, query, limit, offset)).items]

    return await find(
        recall,
        archival,
        Matcher(about, services.archival.embedder),
        await store.messages_since(agent_id, 0),
        await store.load_blocks(agent_id),
        await store.list_conversations(agent_id),
    )


async def forget_about(
    services: AgentServices, agent: AgentRecord, about: str, *, keep: frozenset[int] = frozenset()
) -> tuple[Found, Receipt]:
    """Find what `about` matches now (what was shown may have grown since) and
    erase it; messages whose seq is in `keep` stay (the step under way). The
    inbox and outbox copies of the person's finished events go too, whatever
    matched (bot/forgetting/erasing.py)."""
    found = await find_about(services, agent.id, about)
    found.messages = [message for message in found.messages if message.seq not in keep]
    await services.store.inbox_scrub(agent.key)
    if found.empty:
        await services.store.flush_deleted()
        return found, Receipt()
    matcher = Matcher(about, services.archival.embedder)
    receipt = await erase(services.store, services.llm, matcher, agent.id, found, services.summary_model)
    return found, receipt


async def reload(agent: Agent) -> None:
    """Read the agent's working context, queues and counts again from the store."""
    services = agent.services
    agent.working_context = WorkingContext(await services.store.load_blocks(agent.id))
    current = agent.conversation.place.key
    for key, conversation in list(agent.conversations.items()):
        fresh, _ = await open_conversation(services, agent.id, conversation.place, agent.working_context)
        agent.conversations[key] = fresh
    agent.conversation = agent.conversations[current]
