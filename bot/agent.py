"""One persistent MemGPT agent: the step loop with heartbeats.

An event becomes a message in the queue; then the agent runs LLM steps. Each
step's function calls are executed in order and their results appended; the
chain goes on while a call asks for a heartbeat (or fails), up to a hard cap.
Every message is in recall storage before the next step uses it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.events import Event, Reply
from bot.functions import FunctionSet
from bot.llm import Completion, LLMClient, LLMUnavailableError
from bot.prompts import SUMMARIZER_INSTRUCTIONS
from memory.archival import ArchivalMemory
from memory.queue_manager import (
    PRESSURE_MARKER,
    ContextOverflowError,
    QueueManager,
    render_transcript,
)
from memory.recall import RecallMemory
from memory.store import Store
from memory.tokens import TokenCounter
from memory.types import AgentRecord, Block, Message, utc_now
from memory.working_context import WorkingContext

log = logging.getLogger(__name__)

NO_CALL_NUDGE = (
    "[system alert] Your last reply called no function, so the person saw nothing. Use send_message to answer them."
)
MAX_FLUSHES_PER_STEP = 3
# Room for the assistant message that asked for a page and the result's JSON wrapper.
PAGE_CALL_ALLOWANCE = 160
MIN_PAGE_TOKENS = 96
# Events a person is waiting on: a step that reaches nobody gets a nudge.
ANSWERED_KINDS = frozenset({"user_message", "file_uploaded"})


@dataclass(slots=True)
class AgentServices:
    """What every agent of a runtime shares."""

    store: Store
    archival: ArchivalMemory
    recall: RecallMemory
    llm: LLMClient
    counter: TokenCounter
    functions: FunctionSet
    instructions: str
    context_window: int
    warning_threshold: float
    flush_threshold: float
    evict_fraction: float
    response_reserve: int
    max_steps: int
    search_page_size: int


@dataclass(slots=True)
class EventResult:
    replies: list[Reply] = field(default_factory=list)
    steps: int = 0
    hit_step_cap: bool = False
    trouble: str | None = None


class Agent:
    def __init__(
        self,
        record: AgentRecord,
        blocks: Sequence[Block],
        services: AgentServices,
        recall_count: int,
        archival_count: int,
    ) -> None:
        self.record = record
        self.services = services
        self.working_context = WorkingContext(blocks)
        self.recall_count = recall_count
        self.archival_count = archival_count
        self.queue = QueueManager(
            services.counter,
            services.instructions,
            services.functions.schemas,
            services.context_window,
            warning_threshold=services.warning_threshold,
            flush_threshold=services.flush_threshold,
            evict_fraction=services.evict_fraction,
            response_reserve=services.response_reserve,
        )
        self._outbox: list[str] = []
        # The event being handled, for functions that need its sender or reply
        # address (schedule_reminder delivers where the user asked); None between events.
        self.current_event: Event | None = None

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def store(self) -> Store:
        return self.services.store

    @classmethod
    async def load(cls, key: str, default_blocks: Sequence[Block], services: AgentServices) -> Agent:
        store = services.store
        record, blocks = await store.get_or_create_agent(key, default_blocks)
        queue_messages = await store.messages_since(record.id, record.queue_start_seq)
        agent = cls(
            record,
            blocks,
            services,
            recall_count=await store.count_messages(record.id),
            archival_count=await store.count_passages(record.id),
        )
        agent.queue.load(record.summary, queue_messages, agent.working_context.render())
        await services.archival.resume_pending(record.id)
        return agent

    # -- the event loop of one agent -------------------------------------
    async def handle(self, event: Event) -> EventResult:
        result = EventResult()
        self._outbox = []
        self.current_event = event
        await self.record_messages([Message(role="user", content=event.render(), name=event.kind)])
        while True:
            result.steps += 1
            try:
                await self._make_room()
                completion = await self.services.llm.complete(
                    self.queue.compile(self.status_line()), self.services.functions.schemas
                )
            except LLMUnavailableError as error:
                log.error("agent %s: LLM unavailable: %s", self.id, error)
                result.trouble = error.user_message
                break
            except ContextOverflowError as error:
                log.error("agent %s: %s", self.id, error)
                result.trouble = (
                    "I'm having trouble: my memory is overfull and I could not make room. An admin has been told."
                )
                break
            heartbeat = await self._execute(completion)
            if not heartbeat:
                break
            if result.steps >= self.services.max_steps:
                result.hit_step_cap = True
                log.warning(
                    "agent %s: step cap of %d reached for event %s; yielding",
                    self.id,
                    self.services.max_steps,
                    event.event_id,
                )
                break
        if result.trouble and not self._outbox:
            self._outbox.append(result.trouble)
        result.replies = [
            Reply(
                text=text,
                platform=event.platform,
                user_id=event.user_id,
                reply_to=event.reply_to,
                event_id=event.event_id,
            )
            for text in self._outbox
        ]
        self.current_event = None
        return result

    async def _execute(self, completion: Completion) -> bool:
        """Run one step's function calls in order; returns whether to go on."""
        calls = completion.tool_calls
        assistant = Message(
            role="assistant",
            content=completion.content,
            tool_calls=[call.as_dict() for call in calls] or None,
        )
        produced = [assistant]
        heartbeat = False
        for call in calls:
            outcome = await self.services.functions.run(self, call.name, call.arguments)
            heartbeat = heartbeat or outcome.heartbeat
            status = "OK" if outcome.ok else "Failed"
            produced.append(
                Message(
                    role="tool",
                    tool_call_id=call.id,
                    name=call.name,
                    content=json.dumps({"status": status, "result": outcome.result}, ensure_ascii=False),
                )
            )
        if not calls and not self._outbox and self._awaits_answer():
            # Plain text reaches nobody; tell the model once per step and let it retry.
            # (On ticks, joins and alerts silence is a valid choice: no nudge.)
            produced.append(Message(role="user", content=NO_CALL_NUDGE, name="system_alert"))
            heartbeat = True
        await self.record_messages(produced)
        return heartbeat

    def _awaits_answer(self) -> bool:
        return self.current_event is None or self.current_event.kind in ANSWERED_KINDS

    # -- queue management --------------------------------------------------
    async def _make_room(self) -> None:
        status = self.status_line()
        if self.queue.needs_warning(status):
            used = round(100 * self.queue.pressure(status))
            await self.record_messages(
                [
                    Message(
                        role="user",
                        name="system_alert",
                        content=(
                            f"[system alert] {PRESSURE_MARKER} Your context is {used}% full. The oldest "
                            "messages will soon leave your queue (they stay in recall storage). Save "
                            "anything important to working context or archival storage now."
                        ),
                    )
                ]
            )
            self.queue.warned = True
        for _ in range(MAX_FLUSHES_PER_STEP):
            status = self.status_line()
            if not self.queue.needs_flush(status):
                return
            eviction = await self.queue.evict(status, self._summarize)
            await self.store.update_queue(self.id, eviction.summary, eviction.new_start_seq, utc_now())
            self.queue.apply(eviction)
            self.record.summary, self.record.queue_start_seq = eviction.summary, eviction.new_start_seq
            log.info(
                "agent %s: evicted %d messages (summary by %s)",
                self.id,
                len(eviction.evicted),
                "LLM" if eviction.summarized_by_llm else "truncation",
            )
        self.queue.fits_or_raise(self.status_line())

    async def _summarize(self, previous: str, evicted: Sequence[Message], budget: int) -> str:
        counter = self.services.counter
        system = SUMMARIZER_INSTRUCTIONS.format(max_words=max(40, int(budget * 0.6)))
        header = f"Previous summary:\n{previous or '(none)'}\n\nMessages leaving memory:\n"
        room = (
            self.queue.flush_limit
            - counter.count_request([{"role": "system", "content": system}, {"role": "user", "content": header}])
            - 16
        )
        transcript = counter.truncate(render_transcript(evicted), max(0, room))
        completion = await self.services.llm.complete(
            [{"role": "system", "content": system}, {"role": "user", "content": header + transcript}]
        )
        return (completion.content or "").strip()

    def status_line(self) -> str:
        return (
            f"{self.recall_count} messages in recall storage ({len(self.queue.entries)} in your queue); "
            f"{self.archival_count} passages in archival storage; working context last edited "
            f"{self.working_context.last_edited()}; now {utc_now():%Y-%m-%d %H:%M} UTC."
        )

    # -- memory operations used by the functions ------------------------------
    async def record_messages(self, messages: list[Message]) -> None:
        """Store first, then show to the model: nothing is used before it is kept."""
        await self.store.append_messages(self.id, messages)
        for message in messages:
            self.queue.append(message)
        self.recall_count += len(messages)

    async def save_block(self, block: Block) -> None:
        await self.store.save_block(self.id, block)
        self.working_context.commit(block)
        self.queue.set_working_context(self.working_context.render())

    def send(self, text: str) -> None:
        self._outbox.append(text)

    def page_token_budget(self) -> int:
        """Tokens a page of search results may take. Eviction runs before every
        call and can cut the queue back to this step's call and its result, so
        the page must fit next to the parts that cannot be evicted: the fixed
        prompt, working context, status line, the summary at its full budget,
        and the call that asked for the page with the result's wrapper."""
        queue = self.queue
        pinned = (
            queue.fixed_tokens
            + queue.header_tokens
            + queue.working_context_tokens
            + queue.counter.count(self.status_line())
            + queue.summary_budget()
            + PAGE_CALL_ALLOWANCE
        )
        cap = queue.flush_limit // 5
        return max(MIN_PAGE_TOKENS, min(cap, queue.flush_limit - pinned))
