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
from typing import Any

from bot.durable.outbox import outbox_entry, unconfirmed
from bot.events import Event, Reply
from bot.functions.registry import FunctionSet
from bot.llm import Completion, LLMClient, LLMUnavailableError, TokenUsage
from bot.prompts import SUMMARIZER_INSTRUCTIONS, SUMMARY_REQUEST
from memory.archival import ArchivalMemory
from memory.places import DM_KEY
from memory.queue_manager import (
    PRESSURE_MARKER,
    ContextOverflowError,
    QueueManager,
    render_transcript,
)
from memory.recall import RecallMemory
from memory.store import Store, StoreError
from memory.tokens import TOKENS_PER_MESSAGE, TokenCounter
from memory.types import AgentRecord, Block, ConversationRecord, Message, utc_now
from memory.working_context import WorkingContext

log = logging.getLogger(__name__)

NO_CALL_NUDGE = (
    "[system alert] Your last reply called no function, so the person saw nothing. Use send_message to answer them."
)
INTERRUPTED_RESULT = (
    "Cut short by a restart: this call may or may not have taken effect. Check (working context, "
    "archival storage, reminders) before doing it again."
)
# Functions a redone step may simply run again: reads, and send_message (its
# outbox entry is keyed by event and position, so a redo cannot send twice).
# Their steps skip the extra write that records the calls before they run.
SAFE_TO_REDO = frozenset({"send_message", "conversation_search", "conversation_search_date", "archival_memory_search"})
MAX_FLUSHES_PER_STEP = 3
# Room for the assistant message that asked for a page and the result's JSON wrapper.
PAGE_CALL_ALLOWANCE = 160
MIN_PAGE_TOKENS = 96
# Events a person is waiting on: a step that reaches nobody gets a nudge.
ANSWERED_KINDS = frozenset({"user_message", "file_uploaded"})


def interrupted_calls(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The function calls of the last step that have no result: only a crash
    between recording a step's calls and their results leaves any."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant" and message.tool_calls:
            answered = {later.tool_call_id for later in messages[index + 1 :] if later.role == "tool"}
            return [call for call in message.tool_calls if call.get("id") not in answered]
    return []


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
    max_message_tokens: int = 0  # 0: the queue manager's automatic size
    queue_tokens: int = 0  # MEMGPT_QUEUE_TOKENS; 0: what the window leaves
    # MEMGPT_CACHED_TOKEN_WEIGHT: what a token the server served from its prompt
    # cache counts toward the daily budget (1.0: as much as any other).
    cached_token_weight: float = 1.0
    summary_model: str = ""  # MEMGPT_SUMMARY_MODEL; empty: the chat model


@dataclass(slots=True)
class EventResult:
    replies: list[Reply] = field(default_factory=list)
    steps: int = 0
    hit_step_cap: bool = False
    trouble: str | None = None
    tokens_used: int = 0  # by this event's LLM calls, counted locally (bot/limits.py)
    held: str = ""  # "rate" or "budget": over that limit, no LLM call was made
    # Storage stayed unreachable for MEMGPT_STORE_WAIT: not handled; a durable
    # event stays pending in the journal for a replay (bot/durable/store_wait.py).
    unfinished: bool = False


class Agent:
    def __init__(
        self,
        record: AgentRecord,
        blocks: Sequence[Block],
        services: AgentServices,
        recall_count: int,
        archival_count: int,
        conversation: ConversationRecord | None = None,
    ) -> None:
        self.record = record
        # The queue state of the conversation the queue holds (the DM one).
        self.conversation = conversation or ConversationRecord(record.id, DM_KEY)
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
            max_item_tokens=services.max_message_tokens,
            queue_tokens=services.queue_tokens,
        )
        # Tokens of every LLM call this agent made, counted locally (_complete):
        # what the daily budget charges (cached tokens at their weight), and the
        # parts (prompt, the share the server said it cached, completion).
        self.tokens_used = 0
        self.usage = TokenUsage()
        self._outbox: list[Reply] = []
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
        conversation = await store.get_conversation(record.id, DM_KEY)
        queue_messages = await store.messages_since(record.id, conversation.queue_start_seq)
        agent = cls(
            record,
            blocks,
            services,
            recall_count=await store.count_messages(record.id),
            archival_count=await store.count_passages(record.id),
            conversation=conversation,
        )
        agent.queue.load(conversation.summary, queue_messages, agent.working_context.render())
        await agent.close_interrupted_calls(queue_messages)
        await services.archival.resume_pending(record.id)
        return agent

    async def close_interrupted_calls(self, queue_messages: Sequence[Message]) -> None:
        """Give every function call a crash left without its result an
        "interrupted" one: the model sees what may not have happened, and the
        queue never holds a call without its answer (the API refuses that)."""
        open_calls = interrupted_calls(queue_messages)
        if open_calls:
            log.warning("agent %s: %d function calls were cut short by a restart", self.id, len(open_calls))
            result = json.dumps({"status": "Failed", "result": INTERRUPTED_RESULT})
            await self.record_messages(
                [
                    Message(
                        role="tool",
                        tool_call_id=str(call.get("id")),
                        name=str(call.get("function", {}).get("name")),
                        content=result,
                    )
                    for call in open_calls
                ]
            )

    # -- the event loop of one agent -------------------------------------
    async def handle(self, event: Event) -> EventResult:
        result = EventResult()
        self._outbox = []
        self.current_event = event
        if await self._answered_before_a_crash(event, result):
            self.current_event = None
            return result
        while True:
            result.steps += 1
            try:
                await self._make_room()
                completion = await self._step_call()
            except LLMUnavailableError as error:
                log.error("agent %s: LLM unavailable: %s", self.id, error)
                result.trouble = error.user_message
                break
            except ContextOverflowError as error:
                log.error("agent %s: %s", self.id, error)
                result.trouble = (
                    "I'm having trouble: my memory is overfull and I could not make room. An admin has been told. "
                    "Your message is saved; please try again later."
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
                if not self._outbox:
                    # The chain never reached the person (endless heartbeats, plain text
                    # after every nudge): they get a note instead of silence.
                    result.trouble = (
                        "I'm having trouble: I got stuck working on your message and stopped. "
                        "Your message is saved; please try again shortly."
                    )
                break
        if result.trouble and not self._outbox and self._awaits_answer():
            await self.send(result.trouble)
        result.replies = list(self._outbox)
        self.current_event = None
        return result

    async def _answered_before_a_crash(self, event: Event, result: EventResult) -> bool:
        """Record the event's message, unless a run of this event before a
        crash or a storage fault did (then it is not recorded twice). True when that run also
        answered: `result` then holds its replies not yet confirmed sent, and
        no step runs again (the person must not get a second answer)."""
        store = self.store
        if await self.record_event_message(event, event.render()):
            return False
        # Without an outbox (terminal chat) a redo after a storage fault just runs the steps again.
        sent = await store.outbox_for_event(event.event_id) if event.durable else []
        if not sent:
            log.info("agent %s: redoing event %s (recorded, not answered before a restart)", self.id, event.event_id)
            return False
        log.info(
            "agent %s: event %s was answered before a restart; re-sending what is unconfirmed", self.id, event.event_id
        )
        result.replies = unconfirmed(sent)
        return True

    async def record_event_message(self, event: Event, content: str) -> bool:
        """Record the message of `event`, tagged with its id, unless an earlier
        run of the event (before a crash or a storage fault) did; whether it
        was recorded now."""
        if await self.store.event_message_seq(self.id, event.event_id) is not None:
            return False
        messages = [Message(role="user", content=content, name=event.kind, event_id=event.event_id)]
        # Debounced followers (bot/durable/debounce.py): in the same write, each under its own id.
        messages += [
            Message(role="user", content=f.render(), name=f.kind, event_id=f.event_id) for f in event.members()[1:]
        ]
        await self.record_messages(messages)
        return True

    async def _execute(self, completion: Completion) -> bool:
        """Run one step's function calls in order; returns whether to go on."""
        calls = completion.tool_calls
        assistant = Message(
            role="assistant",
            content=completion.content,
            tool_calls=[call.as_dict() for call in calls] or None,
        )
        produced = [assistant]
        if any(call.name not in SAFE_TO_REDO for call in calls):
            # The call is kept before it runs: a crash inside a function then
            # leaves a record of what was under way, which the next load closes
            # with a "cut short" result (close_interrupted_calls) instead of
            # running it blind a second time (a fact saved twice, two reminders).
            await self.record_messages(produced)
            produced = []
        heartbeat = False
        for call in calls:
            try:
                outcome = await self.services.functions.run(self, call.name, call.arguments)
                ok, result, asks_heartbeat = outcome.ok, outcome.result, outcome.heartbeat
            except StoreError:
                # Storage failing under a function (send_message's outbox write, a memory
                # edit) is no failed call for the model: the whole event waits and is
                # redone (bot/durable/store_wait.py), and the person is told it waits.
                raise
            except Exception as error:
                # A function that breaks on arguments its schema let through (e.g. a page
                # number too big for SQLite) must not crash the agent: like any failed
                # call, the model sees the error and gets a heartbeat to try otherwise.
                log.exception("agent %s: function %s raised", self.id, call.name)
                ok, result, asks_heartbeat = False, f"{call.name} failed: {type(error).__name__}: {error}"[:500], True
            heartbeat = heartbeat or asks_heartbeat
            status = "OK" if ok else "Failed"
            produced.append(
                Message(
                    role="tool",
                    tool_call_id=call.id,
                    name=call.name,
                    content=json.dumps({"status": status, "result": result}, ensure_ascii=False),
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
            used = round(100 * self.queue.pressure())
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
            now = utc_now()
            await self.store.update_queue(self.id, eviction.summary, eviction.new_start_seq, now)
            self.queue.apply(eviction)
            self.conversation.summary, self.conversation.queue_start_seq = eviction.summary, eviction.new_start_seq
            self.conversation.summary_updated_at = now
            log.info(
                "agent %s: evicted %d messages (summary by %s)",
                self.id,
                len(eviction.evicted),
                "LLM" if eviction.summarized_by_llm else "truncation",
            )
        self.queue.fits_or_raise(self.status_line())

    async def _summarize(self, previous: str, evicted: Sequence[Message], budget: int) -> str:
        counter = self.services.counter
        max_words = max(40, int(budget * 0.6))
        if not self.services.summary_model:
            # The chat model summarizes from the prompt it just read (cached by
            # the provider): the agent's own request up to the evicted messages.
            tools = self.services.functions.schemas
            messages = self.queue.summary_prompt(evicted, SUMMARY_REQUEST.format(max_words=max_words))
            # (Within the limit every step keeps to, so the answer has its reserve.)
            if messages and counter.count_request(messages, tools) <= self.queue.flush_limit:
                completion = await self._complete(messages, tools, call_functions=False)
                return (completion.content or "").strip()
        system = SUMMARIZER_INSTRUCTIONS.format(max_words=max_words)
        header = f"Previous summary:\n{previous or '(none)'}\n\nMessages leaving memory:\n"
        room = (
            self.queue.flush_limit
            - counter.count_request([{"role": "system", "content": system}, {"role": "user", "content": header}])
            - 16
        )
        transcript = counter.truncate(render_transcript(evicted), max(0, room))
        completion = await self._complete(
            [{"role": "system", "content": system}, {"role": "user", "content": header + transcript}],
            model=self.services.summary_model or None,
        )
        return (completion.content or "").strip()

    # -- every LLM call, metered ---------------------------------------------
    async def _step_call(self) -> Completion:
        status = self.status_line()
        # The queue manager's cached total (an upper bound of a full recount,
        # function schemas included) spares re-tokenizing the whole prompt.
        return await self._complete(
            self.queue.compile(status), self.services.functions.schemas, self.queue.total_tokens(status)
        )

    async def _complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        prompt_tokens: int = 0,
        *,
        model: str | None = None,
        call_functions: bool = True,
    ) -> Completion:
        """The one way the agent calls the LLM, so each call's cost is counted
        here, with the model's tokenizer (the daily budget, bot/limits.py):
        the prompt with its function schemas, plus the completion. Never the
        server's token counts, which a proxy or local server may not send or
        may get wrong; only its word on how much of the prompt it served from
        its cache, which nothing local can know, and which at most lowers a
        cached token's weight (MEMGPT_CACHED_TOKEN_WEIGHT). A call that fails
        counts nothing."""
        completion = await self.services.llm.complete(messages, tools, model=model, call_functions=call_functions)
        counter = self.services.counter
        prompt = prompt_tokens or counter.count_request(messages, tools or ())
        answer = counter.count(completion.content or "")
        for call in completion.tool_calls:
            answer += TOKENS_PER_MESSAGE + counter.count(call.name) + counter.count(call.arguments)
        cached = min(prompt, completion.cached_tokens)
        self.usage.add(TokenUsage(prompt, cached, answer))
        self.tokens_used += prompt - cached + round(cached * self.services.cached_token_weight) + answer
        return completion

    def status_line(self) -> str:
        """What changes on every call: it rides in the request's last message
        (memory/queue_manager.py), after everything a prompt cache can serve."""
        return (
            f"memory {round(100 * self.queue.pressure())}% full; recall {self.recall_count} messages, "
            f"{len(self.queue.entries)} in queue; archival {self.archival_count} passages; "
            f"now {utc_now():%Y-%m-%d %H:%M} UTC"
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

    async def send(self, text: str) -> None:
        """A reply to the current event. For a durable event it is in the
        outbox (memory/store.py) before send_message returns, so a crash
        from here on cannot lose it."""
        event = self.current_event
        if event is None:
            raise RuntimeError("send() outside an event")
        reply = event.reply(text)
        if event.durable:
            entry = outbox_entry(event, text, len(self._outbox))
            reply.outbox_id = entry.id
            await self.store.outbox_add(entry)
        self._outbox.append(reply)

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
            + queue.status_tokens(self.status_line())
            + queue.summary_budget()
            + PAGE_CALL_ALLOWANCE
        )
        cap = queue.flush_limit // 5
        return max(MIN_PAGE_TOKENS, min(cap, queue.flush_limit - pinned))
