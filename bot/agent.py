"""One persistent MemGPT agent: the step loop with heartbeats.

An event becomes a message in the queue; then the agent runs LLM steps. Each
step's function calls are executed in order and their results appended; the
chain goes on while a call asks for a heartbeat (or fails), up to a hard cap.
Every message is in recall storage before the next step uses it.

An event runs in the conversation of its place (bot/conversation.py): that
place's queue and summary, every message it records tagged with the place,
and every read through the place's visibility (memory/places.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bot.agent_calls import AgentCalls
from bot.channel_context import render_channel_context
from bot.channels.notes import channel_news
from bot.conversation import INTERRUPTED_RESULT, Conversation, interrupted_calls, open_conversation
from bot.durable.outbox import outbox_entry, seen_by_a_later_run, unconfirmed
from bot.events import Event, Reply, UserMessage, stamp
from bot.function_loops import FunctionLoops
from bot.functions.registry import ShownNow
from bot.llm import Completion, LLMUnavailableError, TokenUsage
from bot.llm.types import ToolCall
from bot.services import AgentServices
from memory.places import DM, Place, Visibility
from memory.queue_manager import ContextOverflowError, QueueManager
from memory.store import Store, StoreError
from memory.types import AgentRecord, Block, Message, OutboxEntry, Passage, utc_now
from memory.working_context import WorkingContext

log = logging.getLogger(__name__)

Ending = Callable[[], Awaitable[None]]  # a caller's write at an event's end (Agent.handle)

# The note for a person whose message got no answer from the model (the chain
# ended, or reached the step cap, without sending anything).
NO_ANSWER = (
    "I'm having trouble: I could not put an answer together for your message. "
    "Your message is saved; please try again shortly."
)
NO_CALL_NUDGE = (
    "[system alert] Your last reply called no function, so the person saw nothing. Use send_message to answer them."
)
# Functions a redone step may simply run again: reads, and send_message (its
# outbox entry is keyed by event and position, so a redo cannot send twice).
# Their steps skip the extra write that records the calls before they run.
SAFE_TO_REDO = frozenset({"send_message", "conversation_search", "conversation_search_date", "archival_memory_search"})
# Events a person is waiting on: a step that reaches nobody gets a nudge.
ANSWERED_KINDS = frozenset({"user_message", "file_uploaded"})


@dataclass(slots=True)
class EventResult:
    replies: list[Reply] = field(default_factory=list)
    steps: int = 0
    hit_step_cap: bool = False
    looped: bool = False  # a function loop ended the chain (bot/function_loops.py)
    trouble: str | None = None
    tokens_used: int = 0  # by this event's LLM calls, counted locally (bot/limits.py)
    held: str = ""  # "rate" or "budget": over that limit, no LLM call was made
    # Storage stayed unreachable for MEMGPT_STORE_WAIT: not handled; a durable
    # event stays pending in the inbox for a replay (bot/door.py: StoreWait).
    unfinished: bool = False


class Agent:
    def __init__(
        self, record: AgentRecord, working_context: WorkingContext, services: AgentServices, dm: Conversation
    ) -> None:
        self.record = record
        self.id = record.id
        self.services = services
        self.working_context = working_context
        # One conversation per place, opened on its first event; the DM's at load.
        self.conversations: dict[str, Conversation] = {dm.place.key: dm}
        # The conversation of the event being handled (the DM's between events).
        self.conversation = dm
        # Tokens of every LLM call this agent made, counted locally (bot/agent_calls.py):
        # what the daily budget charges (cached tokens at their weight), and the
        # parts (prompt, the share the server said it cached, completion).
        self.tokens_used = 0
        self.usage = TokenUsage()
        self._outbox: list[Reply] = []
        self._ending: Ending | None = None  # see handle()
        # Outbox entries of replies given since the last write (send): stored with the
        # step's record, in the same store call (record_messages), or at the event's end.
        self._unsaved: list[OutboxEntry] = []
        # The seq of the newest message this copy appended: while the copy is current (bot/door.py
        # reloads it otherwise), nobody appended since, so the store need not read it (append_messages).
        self._newest_seq: int | None = None
        # The event being handled, for functions that need its sender or reply
        # address (schedule_reminder delivers where the user asked); None between events.
        self.current_event: Event | None = None
        # The channel's recent lines for this event's calls only (bot/channel_context.py).
        self._channel_context = ""
        # Every LLM call of this agent (bot/agent_calls.py), and the best plain text
        # the model wrote during the current event (sent if nothing else was).
        self.calls = AgentCalls(self)
        self._best_text = ""
        self._results: dict[str, tuple[bool, str]] = {}  # each function of the last step: ok, result (_execute)
        self._looped = False  # the last chain ended in a function loop or at the step cap (bot/function_loops.py)

    @property
    def store(self) -> Store:
        return self.services.store

    @property
    def queue(self) -> QueueManager:
        """The queue of the current place."""
        return self.conversation.queue

    @property
    def place(self) -> Place:
        return self.conversation.place

    @property
    def visible(self) -> Visibility:
        """What reads made now may return (memory/places.py)."""
        return self.conversation.visible

    @property
    def recall_count(self) -> int:
        """Messages in recall storage that the current place may read."""
        return self.conversation.recall_count

    @recall_count.setter
    def recall_count(self, value: int) -> None:
        self.counted(self.place.key, messages=value - self.recall_count)

    @property
    def archival_count(self) -> int:
        """Passages in archival storage that the current place may read."""
        return self.conversation.archival_count

    @archival_count.setter
    def archival_count(self, value: int) -> None:
        self.counted(self.place.key, passages=value - self.archival_count)

    def counted(self, key: str, *, messages: int = 0, passages: int = 0) -> None:
        """Items stored in conversation `key`: each open place that may read them counts them."""
        for conversation in self.conversations.values():
            if conversation.visible.sees(key):
                conversation.recall_count += messages
                conversation.archival_count += passages

    @classmethod
    async def load(cls, key: str, default_blocks: Sequence[Block], services: AgentServices) -> Agent:
        store = services.store
        record, blocks = await store.get_or_create_agent(key, default_blocks)
        # A block added since the agent was made (the private block) is created on load.
        have = {block.label for block in blocks}
        for block in default_blocks:
            if block.label not in have:
                await store.save_block(record.id, block)
                blocks.append(block)
        working_context = WorkingContext(blocks)
        dm, queue_messages = await open_conversation(services, record.id, DM, working_context)
        agent = cls(record, working_context, services, dm)
        await agent.close_interrupted_calls(queue_messages)
        await services.archival.resume_pending(record.id)
        return agent

    async def conversation_for(self, place: Place) -> Conversation:
        """The conversation of `place`, opened from the store on its first event."""
        conversation = self.conversations.get(place.key)
        if conversation is None:
            conversation, queue_messages = await open_conversation(self.services, self.id, place, self.working_context)
            self.conversations[place.key] = conversation
            await self.close_interrupted_calls(queue_messages, conversation)
        return conversation

    async def close_interrupted_calls(
        self, queue_messages: Sequence[Message], conversation: Conversation | None = None
    ) -> None:
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
                ],
                conversation,
            )

    # -- the event loop of one agent -------------------------------------
    async def handle(self, event: Event, *, ending: Ending | None = None) -> EventResult:
        """Run the event's steps. `ending`: the caller's own write for the
        event (bot/limits.py charges its tokens), made beside the last step's
        record, in the same round trip to the store; not called when the event
        stops before that (a failure, the step cap): the caller then makes it."""
        result = EventResult()
        self._outbox, self._unsaved, self._ending = [], [], ending
        self.current_event = event
        self.conversation = await self.conversation_for(event.place)
        try:
            return await self._run(event, result)
        finally:
            self.queue.protected_seq = None
            self.current_event, self.conversation, self._channel_context = None, self.conversations[DM.key], ""
            self._ending = None

    async def _run(self, event: Event, result: EventResult) -> EventResult:
        if await self._answered_before_a_crash(event, result):
            return result
        if isinstance(event, UserMessage) and event.channel_context:  # none in a DM
            self._channel_context = render_channel_context(
                event, self.services.counter, self.services.channel_context_tokens
            )
        if not event.place.is_dm:  # the channel's notes, and their news (a DM has none)
            self._channel_context = await channel_news(self, event, self._channel_context)
        self.calls.start_event()
        self._best_text = ""
        # A flush keeps this event's message if it can (memory/queue_manager.py).
        ours = [e.message.seq for e in self.queue.entries if e.message.event_id == event.event_id]
        self.queue.protected_seq = ours[0] if ours else None
        loops: FunctionLoops | None = None  # once the chain goes past its first step
        while True:
            result.steps += 1
            try:
                completion = await self.calls.step()
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
            loop = loops.repeated(completion) if loops else ""
            if not loop:
                if not await self._execute(completion, first_step=result.steps == 1):
                    break
                loops = loops or FunctionLoops(after_a_loop=self._looped)
                loop = loops.ran(completion, self._results)
            if loop:
                log.warning("agent %s: a function loop (%s): the chain ends", self.id, loop)
                result.looped = True
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
        self._looped = result.looped or result.hit_step_cap
        if not self._outbox and self._awaits_answer():
            await self._answer_anyway(result)
        await self._save_replies()
        result.replies = list(self._outbox)
        return result

    async def _answer_anyway(self, result: EventResult) -> None:
        """A person's message never ends in silence: the model's own words if it wrote
        any (plain text it was nudged to send); else, when the chain failed with the
        server answering (malformed calls, the step cap, a function loop, or its share
        of the time), the answer of one last request for plain text (bot/agent_calls.py:
        plain_answer). One honest note only when the server is down or refuses, or
        wrote nothing usable."""
        text, asked = self._best_text, False
        if not text and self.calls.may_still_answer(result.trouble):
            asked = True
            try:
                text = self.calls.usable_text(await self.calls.plain_answer())
            except LLMUnavailableError as error:
                log.error("agent %s: LLM unavailable for the plain-text answer: %s", self.id, error)
                result.trouble = error.user_message
        if not text:
            result.trouble = result.trouble or NO_ANSWER
            await self.send(result.trouble)
            return
        result.trouble = None
        await self.send(text)
        if asked:  # kept as the model's answer, its outbox entry in the same write
            await self.record_messages([Message(role="assistant", content=text)])

    async def _answered_before_a_crash(self, event: Event, result: EventResult) -> bool:
        """Record the event's message, unless a run of this event before a
        crash or a storage fault did (then it is not recorded twice). True when that run also
        answered: `result` then holds its replies not yet confirmed sent, and
        no step runs again (the person must not get a second answer)."""
        store = self.store
        if await self.record_event_message(event, event.render()):
            return False
        # Without an outbox (terminal chat) a redo after a storage fault just runs the steps again.
        sent = await store.outbox_for_event(event.event_id) if event.replies_in_outbox else []
        if not sent and await seen_by_a_later_run(store, self.id, event):
            log.info("agent %s: event %s was seen by a later event's run; not redone", self.id, event.event_id)
            return True
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
        messages = [Message(role="user", content=content, name=event.kind, event_id=event.event_id)]
        # Debounced followers (bot/durable/debounce.py): in the same write, each under its own id.
        messages += [
            Message(role="user", content=f.render(), name=f.kind, event_id=f.event_id) for f in event.members()[1:]
        ]
        # The check for an earlier run's message is part of the write (one store call); on a first run
        # there cannot be one.
        unless = None if event.first_run else event.event_id
        return await self.record_messages(messages, await self.conversation_for(event.place), unless_event=unless)

    async def _execute(self, completion: Completion, *, first_step: bool = False) -> bool:
        """Run one step's function calls in order; returns whether to go on."""
        calls = completion.tool_calls
        self._name_calls(calls)
        text = self.calls.usable_text(completion.content) if completion.content_is_text and not calls else ""
        if not calls and text and self._awaits_answer() and not self._outbox:
            if (first_step or self.calls.plain_steps) and self.services.plain_text_replies:
                # Answered in plain text, not in a heartbeat chain (or asked for plain
                # text: the server drops the functions): that text is the answer (small
                # local models rarely call send_message every time).
                await self.send(text)
                await self._record_step([Message(role="assistant", content=completion.content)], last=True)
                return False
            self._best_text = text
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
        heartbeat, self._results = False, {}
        for call in calls:
            try:
                outcome = await self.services.functions.run(self, call.name, call.arguments)
                ok, result, asks_heartbeat = outcome.ok, outcome.result, outcome.heartbeat
            except StoreError:
                # Storage failing under a function (send_message's outbox write, a memory
                # edit) is no failed call for the model: the whole event waits and is
                # redone (bot/door.py: StoreWait), and the person is told it waits.
                raise
            except Exception as error:
                # A function that breaks on arguments its schema let through (e.g. a page
                # number too big for SQLite) must not crash the agent: like any failed
                # call, the model sees the error and gets a heartbeat to try otherwise.
                log.exception("agent %s: function %s raised", self.id, call.name)
                ok, result, asks_heartbeat = False, f"{call.name} failed: {type(error).__name__}: {error}"[:500], True
            heartbeat = heartbeat or asks_heartbeat
            self._results[call.name] = ok, result
            # A function with nothing to tell (send_message) gives its status alone.
            body = {"status": "OK" if ok else "Failed"} | ({"result": result} if result else {})
            content = json.dumps(body, ensure_ascii=False)
            message = Message(role="tool", tool_call_id=call.id, name=call.name, content=content)
            if isinstance(result, ShownNow):  # the model reads it now; recall keeps `kept` (bot/channels/recall.py)
                message.shown, message.content = content, json.dumps(body | {"result": result.kept}, ensure_ascii=False)
            produced.append(message)
        if not calls and not self._outbox and self._awaits_answer() and (completion.content or "").strip():
            # Plain text reaches nobody; tell the model once per step and let it retry.
            # (On ticks, joins and alerts silence is a valid choice: no nudge. Nor after an
            # empty answer, which llama-cpp-python's chatml-function-calling gives whenever
            # its model does not call: the chain ends, and a plain-text request follows.)
            produced.append(Message(role="user", content=NO_CALL_NUDGE, name="system_alert"))
            heartbeat = True
        await self._record_step(produced, last=not heartbeat)
        return heartbeat

    def _name_calls(self, calls: Sequence[ToolCall]) -> None:
        """Each call gets the bot's own id: 9 digits (3 tokens, where a server's
        is about 15, in every later request), valid on every server (Mistral
        takes exactly 9 alphanumerics). Unique in the agent's history: from
        the seq the step's record will follow, which grows with every step."""
        newest = self._newest_seq
        if newest is None:  # nothing appended by this copy yet (a redone event): its queue's newest
            newest = max((entry.message.seq for entry in self.queue.entries), default=0)
        base = (newest + 1) % 10**7
        for index, call in enumerate(calls):
            call.id = f"{base:07d}{index:02d}"

    async def _record_step(self, messages: list[Message], *, last: bool) -> None:
        """A step's record; the event's last one shares its round trip with the caller's `ending`."""
        ending = self._ending if last else None
        if ending is None:
            await self.record_messages(messages)
            return
        self._ending = None
        await asyncio.gather(self.record_messages(messages), ending())

    def _awaits_answer(self) -> bool:
        return self.current_event is None or self.current_event.kind in ANSWERED_KINDS

    def status_line(self, *, memory: bool = True) -> str:
        """What changes on every call: it rides in the request's last message
        (memory/queue_manager.py), after everything a prompt cache can serve;
        so does a channel's recent lines, shown for the current event only.
        `memory=False` (a step that has nothing new to tell): "" unless a channel's lines must ride."""
        if not memory and not self._channel_context:
            return ""
        status = (
            f"memory {round(100 * self.queue.pressure())}% full; recall {self.recall_count} messages, "
            f"archival {self.archival_count} passages"
        )
        # Every event's line opens with its time (to the minute): the clock is news only once it moved on.
        now, event = utc_now(), self.current_event
        if event is None or event.created_at.replace(second=0, microsecond=0) != now.replace(second=0, microsecond=0):
            status += f"; now {stamp(now)}"
        return f"{status}\n{self._channel_context}" if self._channel_context else status

    # -- memory operations used by the functions ------------------------------
    async def record_messages(
        self, messages: list[Message], conversation: Conversation | None = None, *, unless_event: str | None = None
    ) -> bool:
        """Store first, then show to the model: nothing is used before it is
        kept. In the current place's conversation unless one is given. With
        `unless_event`, only if no message of that event is stored yet;
        whether they were recorded."""
        conversation = conversation or self.conversation
        for message in messages:
            message.place = conversation.place.key
        # The replies sent since the last write go with it: one store call, not two (SQLite: one transaction).
        replies, self._unsaved = self._unsaved, []
        stored = await self.store.append_messages(
            self.id, messages, unless_event=unless_event, replies=replies, after=self._newest_seq
        )
        if len(stored) < len(messages):
            return False  # the event's message was stored before
        self._newest_seq = stored[-1].seq if stored else self._newest_seq
        conversation.queue.append(*messages)
        self.counted(conversation.place.key, messages=len(messages))
        return True

    async def save_passages(self, passages: list[Passage]) -> None:
        """Into archival storage, saved in (and visible as from) the current place."""
        for passage in passages:
            passage.place = self.place.key
        await self.services.archival.insert(self.id, passages)
        self.counted(self.place.key, passages=len(passages))

    async def save_block(self, block: Block) -> None:
        await self.store.save_block(self.id, block)
        self.working_context.commit(block)
        for conversation in self.conversations.values():
            conversation.show(self.working_context, edited_here=conversation is self.conversation)

    async def send(self, text: str) -> None:
        """A reply to the current event. For an event whose replies are kept it goes into the
        outbox (memory/store.py) with the step's record (record_messages),
        before the model sees that it was sent and before the event's replies
        are handed back to be delivered: a crash from then on cannot lose it,
        and one before then sent nothing (the event is redone)."""
        event = self.current_event
        if event is None:
            raise RuntimeError("send() outside an event")
        reply = event.reply(text)
        if event.replies_in_outbox:
            entry = outbox_entry(reply, len(self._outbox))
            reply.outbox_id = entry.id
            self._unsaved.append(entry)
        self._outbox.append(reply)

    async def _save_replies(self) -> None:
        """Replies not yet stored with a step's record (the event's last words): into the outbox now."""
        replies, self._unsaved = self._unsaved, []
        for entry in replies:
            await self.store.outbox_add(entry)
