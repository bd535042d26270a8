"""What every agent of a runtime shares: storage, the model, the functions, the settings of the step loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.functions.registry import FunctionSet
from bot.llm import LLMClient
from memory.archival import ArchivalMemory
from memory.channel_notes import ChannelNotes
from memory.channels import ChannelMemory
from memory.recall import RecallMemory
from memory.store import Store
from memory.tokens import TokenCounter


@dataclass(slots=True)
class AgentServices:
    """What every agent of a runtime shares."""

    store: Store
    archival: ArchivalMemory
    recall: RecallMemory
    llm: LLMClient
    counter: TokenCounter
    # The functions the model may call, each run for the agent that holds these
    # services: FunctionSet[Agent] (bot/functions/core.py), which cannot be named
    # here without the agent and its services importing each other.
    functions: FunctionSet[Any]
    instructions: str
    context_window: int
    warning_threshold: float
    flush_threshold: float
    evict_fraction: float
    response_reserve: int
    max_steps: int
    search_page_size: int
    max_message_tokens: int = 0  # 0: the queue manager's automatic size
    queue_tokens: int = 0  # MEMGPT_QUEUE_TOKENS; 0: what the window leaves
    # MEMGPT_CACHED_TOKEN_WEIGHT: what a token the server served from its prompt
    # cache counts toward the daily budget (1.0: as much as any other).
    cached_token_weight: float = 1.0
    summary_model: str = ""  # MEMGPT_SUMMARY_MODEL; empty: the chat model
    channel_context_tokens: int = 0  # MEMGPT_CHANNEL_CONTEXT_TOKENS; 0: none shown
    # MEMGPT_PLAIN_TEXT_REPLIES: a first step's plain text (no function call) is the answer.
    plain_text_replies: bool = True
    # MEMGPT_MESSAGE_TIME_BUDGET: seconds all LLM calls of one event may take; 0: no budget.
    message_time_budget: float = 0.0
    # Channels' memories (memory/channels.py), searched from a channel (bot/channels/recall.py),
    # and their notes (memory/channel_notes.py); None: no channel memory (bare services in tests).
    channels: ChannelMemory | None = None
    channel_notes: ChannelNotes | None = None
    # Forget a topic in what channels kept of a person (key, topic), after their turn:
    # the chat's forget_memories (bot/functions/forget.py); set by the runtime.
    forget_in_channels: Callable[[str, str], None] | None = None
