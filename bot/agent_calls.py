"""Every LLM call one agent makes: the step's call, the summaries that make room
for it, and their metering. The agent's use of the client (bot/llm/), kept
beside the agent: it reads and changes the agent's queue and conversation,
which the client knows nothing of.

- Before each step the queue is fitted to what the server taught (its context
  limit, its token count per ours: bot/llm/client.py), then flushed as needed.
- A step the server refuses as over its context flushes harder (the limits
  learned from the refusal, or one more eviction) and is sent again.
- Every call carries a `max_tokens` for its purpose (a step: the response
  reserve; a summary: its budget), which the client also reads no further than
  (bot/llm/types.py: read_answer), and the deadline of the message's time budget:
  the steps have three quarters of it, the rest is kept for one last request
  when the chain fails (`plain_answer`).
- Every call's tokens are counted here, with the model's tokenizer (the daily
  budget, bot/limits.py); see `complete`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from typing import Any, Protocol

from bot.conversation import Conversation
from bot.llm import LATE, Completion, ContextLimitError, Request, TokenUsage, tools_as_text, trouble
from bot.prompts import SUMMARIZER_INSTRUCTIONS, SUMMARY_REQUEST
from bot.services import AgentServices
from memory.queue_manager import PRESSURE_MARKER, STATUS_MARKER, ContextOverflowError, render_transcript
from memory.types import Message

log = logging.getLogger(__name__)

MAX_FLUSHES_PER_STEP = 3
# Tries of a step the server refuses as over its context, each after a harder flush.
CONTEXT_RETRIES = 3
# A refusal that gave no token count: the margin grows by this much.
UNCOUNTED_MARGIN = 1.15
MAX_RATIO = 4.0
# The share of the message's time budget the steps may use; the rest is the last
# plain-text request's when a chain fails.
STEPS_SHARE = 0.75
MIN_PLAIN_SECONDS = 5.0  # a plain-text request after the steps ran out of time needs at least this
# What the system writes into the model's context: a plain-text answer that repeats it
# (small models echo the status and alerts) is not an answer for the person.
SYSTEM_MARKERS = ("[system alert]", PRESSURE_MARKER, STATUS_MARKER)
# A line of a plain-text answer this long found in the system's instructions is an echo of them.
ECHO_LENGTH = 12
TRANSCRIPT_HEAD = re.compile(r"^\s*\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}(?: UTC)?\] [^:\n]{1,60}: ")
ANSWER_FUNCTION = "send_message"  # its call is the answer to a person
# The last request of a failed chain (plain_answer): the model's words are sent as they are.
PLAIN_ANSWER_REQUEST = (
    "## Now\nAnswer the person's last message in plain text, in your own words: what you write is sent to them "
    "as it is. No function calls."
)


class CallingAgent(Protocol):
    """What the calls need of their agent (bot/agent.py): its services, the
    conversation of the current place (its queue), and its token counts, which they add to."""

    services: AgentServices
    id: str
    usage: TokenUsage
    tokens_used: int

    @property
    def conversation(self) -> Conversation: ...

    def status_line(self, *, memory: bool = True) -> str: ...

    async def record_messages(self, messages: list[Message]) -> bool: ...


class AgentCalls:
    def __init__(self, agent: CallingAgent) -> None:
        self.agent = agent
        # time.monotonic() by which the current event's steps must be done, and its
        # last plain-text request (None: no budget).
        self.deadline: float | None = None
        self.last_deadline: float | None = None
        self.status_told = False  # whether one of the event's steps carried the memory status
        # The function schemas' tokens, for the server's count to be checked against
        # (bot/llm/client.py: Endpoint.check_tools): (the list, its length, tokens).
        self._tool_tokens: tuple[object, int, int] = (None, 0, 0)

    def start_event(self) -> None:
        budget = self.agent.services.message_time_budget
        now = time.monotonic()
        self.deadline = now + budget * STEPS_SHARE if budget > 0 else None
        self.status_told = False  # make_room
        self.last_deadline = now + budget if budget > 0 else None

    # -- the step -------------------------------------------------------------
    async def step(self, named: str = "") -> Completion:
        """The step's call; `named`: the one function it must call (plain_answer's)."""
        agent = self.agent
        queue = agent.conversation.queue
        for attempt in range(CONTEXT_RETRIES):
            self.fit_server()
            status = await self.make_room()
            try:
                completion = await self._step_call(status, named)
                self.status_told = True
                return completion
            except ContextLimitError as error:
                if attempt == CONTEXT_RETRIES - 1:
                    raise
                limits = agent.services.llm.limits()
                if not error.server_prompt_tokens:
                    limits.ratio = min(MAX_RATIO, limits.ratio * UNCOUNTED_MARGIN)
                before = queue.flush_limit
                self.fit_server()
                log.warning(
                    "agent %s: the LLM server refused the prompt as over its context (%s); limit %d -> %d tokens, "
                    "flushing and retrying",
                    agent.id,
                    error,
                    before,
                    queue.flush_limit,
                )
                if queue.flush_limit == before and not queue.needs_flush(agent.status_line()):
                    # Nothing learned (no count, no limit in the refusal): one more eviction.
                    try:
                        await self._evict()
                    except ContextOverflowError:
                        raise error from None
        raise AssertionError("unreachable")

    def fit_server(self) -> None:
        limits = self.agent.services.llm.limits()
        self.agent.conversation.queue.fit_server(limits.context_limit, limits.ratio)

    @property
    def plain_steps(self) -> bool:
        """Whether steps ask for plain text: the server drops the functions (bot/llm/client.py)."""
        return self.agent.services.llm.endpoint.tools_dropped

    async def _step_call(self, status: str, named: str = "") -> Completion:
        if self.plain_steps:
            return await self._plain_call()
        queue = self.agent.conversation.queue
        # The queue manager's cached total (an upper bound of a full recount,
        # function schemas included) spares re-tokenizing the whole prompt.
        return await self.complete(
            queue.compile(status),
            queue.offered_tools,
            queue.total_tokens(status),
            max_tokens=queue.response_reserve,
            named_function=named,
        )

    def may_still_answer(self, note: str | None) -> bool:
        """Whether the last plain-text request is worth making after the steps: they
        ended without a note (the chain failed), or ran out of their share of the time
        (a slow server is no server that is down) with some of the rest still left."""
        if note is None:
            return True
        left = None if self.last_deadline is None else self.last_deadline - time.monotonic()
        return note == trouble(LATE) and left is not None and left >= MIN_PLAIN_SECONDS

    async def plain_answer(self) -> str:
        """The chain failed (malformed calls, the step cap, a function loop): one last
        request, without functions, asks for the answer in plain text, with the rest of
        the message's time. The instruction goes in the system message and the person's
        message last (a small model answers, or copies, the newest turn); the system's
        alerts and the chain's plain texts that reached no one are left out, and its
        function calls and results go as text, which any chat template renders. The
        model's text (or, from a server that sends a call anyway, send_message's), for
        the agent to judge (`usable_text`). Where the server streams a call asked for by
        name (bot/llm/named_calls.py), the step's own request with send_message named
        comes first: its prompt cache serves it, where this other prompt is read again
        whole; the plain one only if that brought no usable answer (a server that ignores the name)."""
        self.deadline = self.last_deadline
        if self.agent.services.llm.endpoint.names_calls and not self.plain_steps:
            answered = self._answer_in(await self.step(ANSWER_FUNCTION))
            if self.usable_text(answered):
                return answered
        return self._answer_in(await self._plain_call())

    @staticmethod
    def _answer_in(completion: Completion) -> str:
        """The model's text, or (from a server that sends a call anyway) send_message's message."""
        if completion.content_is_text and (completion.content or "").strip():
            return completion.content or ""
        for call in completion.tool_calls:
            if call.name == ANSWER_FUNCTION:
                try:
                    message = json.loads(call.arguments).get("message")
                except (ValueError, AttributeError):
                    continue
                if isinstance(message, str):
                    return message
        return ""

    async def _plain_call(self) -> Completion:
        """The request of `plain_answer`, also every step's on a server that drops the
        functions (they would only lengthen the prompt)."""
        queue = self.agent.conversation.queue
        system = {"role": "system", "content": f"{queue.system_text()}\n\n{PLAIN_ANSWER_REQUEST}"}
        event = queue.protected_seq  # the person's message (the event's first)
        kept, theirs = [], []
        for entry in queue.entries:
            message = entry.message
            if event is not None and message.seq == event:
                theirs.append(entry.payload)
            elif message.name == "system_alert" or (
                event is not None and message.seq > event and message.role == "assistant" and not message.tool_calls
            ):
                continue  # the system's alerts, and this chain's plain texts that reached no one
            else:
                kept.append(entry.payload)
        messages = tools_as_text([system, *kept, *theirs])
        return await self.complete(messages, max_tokens=queue.response_reserve, teaches_ratio=False)

    def usable_text(self, text: str | None) -> str:
        """`text` as an answer for the person, without what echoes the system's own
        words into the prompt (small models copy the memory status, the alerts,
        "(none yet)" of an empty summary, a message's "[time] name: " head): the lines
        that carry a marker, repeat a line of it or a part of its instructions (in any
        case), or hold no word; "" when nothing is left."""
        agent, queue = self.agent, self.agent.conversation.queue
        written = f"{queue.system_text()}\n{PLAIN_ANSWER_REQUEST}\n{agent.status_line()}".lower()
        lines = {" ".join(line.split()) for line in written.splitlines()}
        # Parts only of the system's own words: the memory (working context, summary) may be quoted.
        flat_written = " ".join(f"{queue.instructions}\n{PLAIN_ANSWER_REQUEST}".lower().split())
        kept = []
        for line in (text or "").strip().splitlines():
            line = TRANSCRIPT_HEAD.sub("", line)  # "[2026-12-07 17:44 UTC] user: ": a message's rendering
            flat = " ".join(line.split()).lower()
            echo = flat in lines or (len(flat) >= ECHO_LENGTH and flat in flat_written)
            if not (echo or any(marker in line for marker in SYSTEM_MARKERS)) and any(c.isalnum() for c in line):
                kept.append(line)
        return "\n".join(kept).strip()

    def tool_tokens(self, tools: list[dict[str, Any]]) -> int:
        """Our count of `tools` (the same list on every step: counted once)."""
        known, length, tokens = self._tool_tokens
        if known is not tools or length != len(tools):
            tokens = self.agent.services.counter.count_tools(tools)
            self._tool_tokens = (tools, len(tools), tokens)
        return tokens

    # -- queue management --------------------------------------------------
    async def make_room(self) -> str:
        """Warn of memory pressure and flush as needed before a step; the status line the
        step's request carries, worked out again only when an alert or a flush changed it.
        An event's later steps carry it only then: the first step's told the rest (a heartbeat
        step's status would be new tokens for a prompt cache, twice)."""
        agent = self.agent
        queue = agent.conversation.queue
        status = agent.status_line()
        told = self.status_told
        if queue.needs_warning(status):
            told = False
            used = round(100 * queue.pressure())
            await agent.record_messages(
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
            queue.warned = True
            status = agent.status_line()
        for _ in range(MAX_FLUSHES_PER_STEP):
            if not queue.needs_flush(status):
                return agent.status_line(memory=False) if told else status
            await self._evict()
            status = agent.status_line()
            told = False
        queue.fits_or_raise(status)
        return status

    async def _evict(self) -> None:
        agent = self.agent
        eviction = await agent.conversation.queue.evict(agent.status_line(), self.summarize)
        await agent.conversation.flushed(agent.services.store, eviction)
        log.info(
            "agent %s: evicted %d messages (summary by %s)",
            agent.id,
            len(eviction.evicted),
            "LLM" if eviction.summarized_by_llm else "truncation",
        )

    async def summarize(self, previous: str, evicted: Sequence[Message], budget: int) -> str:
        agent = self.agent
        counter, queue = agent.services.counter, agent.conversation.queue
        max_words = max(40, int(budget * 0.6))
        # The answer's cap: the budget, and a little over (the queue cuts a longer
        # summary to the budget); a model that runs on stops there, not at the window.
        max_tokens = budget + 32
        if not agent.services.summary_model:
            # The chat model summarizes from the prompt it just read (cached by
            # the provider): the agent's own request up to the evicted messages.
            tools = queue.offered_tools
            messages = queue.summary_prompt(evicted, SUMMARY_REQUEST.format(max_words=max_words))
            if messages:
                tokens = counter.count_request(messages, tools)
                # Within the limit every step keeps to, so the answer has at least
                # the reserve; the prompt and the cap together stay in the window.
                if tokens <= queue.flush_limit:
                    cap = max(64, min(max_tokens, queue.answer_room(tokens)))
                    # Not a lesson for the steps' ratio: with no call allowed a server may leave
                    # the schemas out (llama-cpp-python counted 0.52 of ours, tools included),
                    # and the steps' margin decayed toward none.
                    completion = await self.complete(
                        messages, tools, tokens, call_functions=False, max_tokens=cap, teaches_ratio=False
                    )
                    return (completion.content or "").strip()
        system = SUMMARIZER_INSTRUCTIONS.format(max_words=max_words)
        header = f"Previous summary:\n{previous or '(none)'}\n\nMessages leaving memory:\n"
        room = (
            queue.flush_limit
            - max(0, max_tokens - queue.response_reserve)
            - counter.count_request([{"role": "system", "content": system}, {"role": "user", "content": header}])
            - 16
        )
        transcript = counter.truncate(render_transcript(evicted), max(0, room))
        request = [{"role": "system", "content": system}, {"role": "user", "content": header + transcript}]
        tokens = counter.count_request(request)
        completion = await self.complete(
            request,
            prompt_tokens=tokens,
            model=agent.services.summary_model or None,
            max_tokens=max(64, min(max_tokens, queue.answer_room(tokens))),
            teaches_ratio=False,  # a transcript tokenizes unlike the agent's prompts (issue 21: 1.4x)
        )
        return (completion.content or "").strip()

    # -- every LLM call, metered ---------------------------------------------
    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        prompt_tokens: int = 0,
        *,
        model: str | None = None,
        call_functions: bool = True,
        max_tokens: int = 0,
        teaches_ratio: bool = True,
        named_function: str = "",
    ) -> Completion:
        """The one way the agent calls the LLM, so each call's cost is counted
        here, with the model's tokenizer (the daily budget, bot/limits.py):
        the prompt with its function schemas, plus the completion. Never the
        server's token counts for the budget, which a proxy or local server may
        not send or may get wrong (they teach the client its margin, bot/llm/client.py);
        only its word on how much of the prompt it served from its cache, which
        nothing local can know, and which at most lowers a cached token's weight
        (MEMGPT_CACHED_TOKEN_WEIGHT). A call that fails counts nothing."""
        agent = self.agent
        counter = agent.services.counter
        prompt = prompt_tokens or counter.count_request(messages, tools or ())
        completion = await agent.services.llm.complete(
            Request(
                messages,
                tools,
                model=model,
                call_functions=call_functions,
                max_tokens=max_tokens,
                deadline=self.deadline,
                # Our count, for the server's ratio to the agent's prompts and whether
                # it rendered the functions (bot/llm/client.py: Endpoint).
                prompt_tokens=prompt if teaches_ratio else 0,
                tool_tokens=self.tool_tokens(tools) if tools and teaches_ratio else 0,
                count_tokens=counter.count,
                named_function=named_function,
            )
        )
        answer = counter.count_answer(completion.content or "", [(c.name, c.arguments) for c in completion.tool_calls])
        cached = min(prompt, completion.usage.cached)
        agent.usage.add(TokenUsage(prompt, cached, answer))
        agent.tokens_used += prompt - cached + round(cached * agent.services.cached_token_weight) + answer
        return completion
