"""Property: whatever the LLM server does, one user message gets a bounded, clear answer,
and a real one whenever an answer was possible.

Hypothesis drives 1,000 random sequences of LLM faults (HTTP errors, timeouts, refused and
cut connections, bodies that are not a chat completion, and model misbehaviour: plain text,
floods of tool calls, arguments that are not JSON, unknown functions, endless heartbeats)
through the scripted local server (tests/fake_llm.py), the real `openai` client in
bot/llm/, a real SQLite store and the real embedder. For every event it checks that:

- `Runtime.handle_with_details` never raises and never hangs;
- the agent stops within the step cap;
- the person gets either the model's own answers (its send_message texts, or its plain
  text) or exactly one clear "having trouble, your message is saved, try again" note,
  never nothing and never two notes;
- split by whether an answer was possible: where the server itself never failed (no
  fault, or only the model's: plain text, bad or unknown calls, floods, endless
  heartbeats, which the bot recovers from with its last plain-text request), the
  model's answers and never the note; from a server that refuses connections, the
  note only; where the server failed (errors, timeouts, cut or unreadable bodies),
  either, as its retries allowed;
- the person's message is stored exactly once in recall storage.

Per fault class it counts events, faulty responses served and events that survived; the
table is printed at the end of the module and written to $MEMGPT_FAULT_REPORT if set.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

from bot.events import UserMessage
from bot.llm import LLMClient, LLMUnavailableError, Request
from bot.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.fake_llm import (
    RETRY_NOW,
    FakeLLMServer,
    RefusedPort,
    Reply,
    fault_delay,
    fault_disconnect,
    fault_malformed_json,
    fault_non_json,
    fault_status,
    fault_truncated_body,
    reply_text,
    reply_tool_calls,
    tool_call,
)
from tests.helpers import said

# Tiny timeouts keep 1,000 examples fast; a local reply takes a few milliseconds, and a
# spurious timeout under load only turns an answer into a trouble note (still a pass).
LLM_TIMEOUT = 0.2
SLOW_REPLY = 0.5  # the server's delay for a timeout fault: well past LLM_TIMEOUT
EVENT_DEADLINE = 20.0  # an event still running after this is stuck
EXAMPLES = int(os.environ.get("MEMGPT_FAULT_EXAMPLES", "1000"))
RETRIES = (0, 1, 1, 2)  # the client's max_retries, per event
# Without a usable Retry-After the openai client backs off 0.4-0.5 s before a retry (its
# INITIAL_RETRY_DELAY); hundreds of those would dominate the run, so the rig shortens it.
# The retry decisions themselves stay the client's.
INITIAL_RETRY_DELAY = 0.02

# Fault classes, as reported in the summary table.
TIMEOUT = "timeout"
RATE_LIMIT_RETRY_AFTER = "429 with Retry-After"
RATE_LIMIT_BARE = "429 without Retry-After"
SERVER_ERROR = "5xx"
REFUSED = "connection refused"
DISCONNECT = "disconnect (no response)"
TRUNCATED = "truncated body"
NON_JSON = "non-JSON body"
WRONG_SHAPE = "JSON, not a completion"
PLAIN_TEXT = "plain text, no tool call"
MANY_CALLS = "5-20 tool calls at once"
BAD_ARGUMENTS = "arguments not JSON"
UNKNOWN_FUNCTION = "unknown function"
ENDLESS_HEARTBEAT = "endless heartbeats"
OK = "ok"  # a well-formed step: not a fault, not reported
# The model's misbehaviour inside well-formed answers: the bot recovers from these.
MODEL_FAULTS = frozenset({PLAIN_TEXT, MANY_CALLS, BAD_ARGUMENTS, UNKNOWN_FUNCTION, ENDLESS_HEARTBEAT})

FAULT_CLASSES = (
    TIMEOUT,
    RATE_LIMIT_RETRY_AFTER,
    RATE_LIMIT_BARE,
    SERVER_ERROR,
    REFUSED,
    DISCONNECT,
    TRUNCATED,
    NON_JSON,
    WRONG_SHAPE,
    PLAIN_TEXT,
    MANY_CALLS,
    BAD_ARGUMENTS,
    UNKNOWN_FUNCTION,
    ENDLESS_HEARTBEAT,
)

ANSWER = "answer: "  # every send_message text the model is scripted to send starts with this
# What a model answers in plain text, without a function call: sent to the person as
# the answer (MEMGPT_PLAIN_TEXT_REPLIES), except the empty one, which ends the chain (the
# plain-text request follows).
PLAIN_TEXTS = ("Sure, I can help.", "", f"{ANSWER}in plain text", "send_message('hi')")
# A model asked without functions (the bot's last request of a failed chain) writes text,
# however it misused them: the step's scripted answer, where the server answers at all.
PLAIN_ANSWER = reply_text(f"{ANSWER}asked plainly")


# --------------------------------------------------------------------------- tally


@dataclass
class Tally:
    """Per fault class: the events it reached (a fault scripted after the one that ended an
    event never does), the faulty responses served in all, and how those events ended."""

    events: Counter[str] = field(default_factory=Counter)
    served: Counter[str] = field(default_factory=Counter)
    survived: Counter[str] = field(default_factory=Counter)
    answered: Counter[str] = field(default_factory=Counter)
    trouble: Counter[str] = field(default_factory=Counter)
    capped: Counter[str] = field(default_factory=Counter)
    total_events: int = 0
    total_survived: int = 0
    started: float = field(default_factory=time.monotonic)
    # The classes served during the current event.
    current: set[str] = field(default_factory=set)
    # Served counts are bumped from the server's request threads.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self, fault: str) -> None:
        with self.lock:
            self.served[fault] += 1
            self.current.add(fault)

    def start_event(self) -> None:
        with self.lock:
            self.current = set()

    def end_event(self, *, survived: bool, answered: bool, trouble: bool, capped: bool) -> None:
        with self.lock:
            faults = set(self.current)
        self.total_events += 1
        self.total_survived += survived
        for fault in faults:
            self.events[fault] += 1
            self.survived[fault] += survived
            self.answered[fault] += answered
            self.trouble[fault] += trouble
            self.capped[fault] += capped

    def table(self) -> str:
        head = f"{'fault class':<26} {'events':>6} {'served':>6} {'survived':>8} {'answered':>8} "
        head += f"{'trouble':>7} {'capped':>6}"
        lines = [head, "-" * len(head)]
        for fault in FAULT_CLASSES:
            lines.append(
                f"{fault:<26} {self.events[fault]:>6} {self.served[fault]:>6} {self.survived[fault]:>8} "
                f"{self.answered[fault]:>8} {self.trouble[fault]:>7} {self.capped[fault]:>6}"
            )
        lines.append("-" * len(head))
        lines.append(
            f"{'all events':<26} {self.total_events:>6} {'':>6} {self.total_survived:>8}"
            f"   ({time.monotonic() - self.started:.1f} s)"
        )
        lines.append(
            "events: events the fault reached; served: faulty responses (refused: connection attempts); "
            "survived: no exception, within the step cap, answers or exactly one clear trouble note, "
            "message stored once; answered / trouble: how the event ended; capped: stopped by the step cap."
        )
        return "\n".join(lines)


TALLY = Tally()


@dataclass(frozen=True)
class Counted(Reply):
    """A scripted reply that counts, per fault class, how often the server really served it
    (a fault queued after the one that ended the event is never served)."""

    fault: str
    inner: Reply

    def respond(self, h: Any, request: dict[str, Any]) -> None:
        if not request.get("tools") and (self.fault == OK or self.fault in MODEL_FAULTS):
            PLAIN_ANSWER.respond(h, request)
            return
        if self.fault != OK:
            TALLY.serve(self.fault)
        self.inner.respond(h, request)


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Step:
    fault: str
    reply: Reply


@dataclass(frozen=True)
class Scenario:
    """One event: the server answers ``steps`` in order, one per HTTP request (client retries
    included), then ``tail`` for every request after that."""

    steps: tuple[Step, ...]
    tail: tuple[Step, ...]  # cycled
    max_retries: int
    refused: bool  # the client points at a port nobody listens on
    durable: bool  # replies go through the outbox (adapters that report deliveries)


def calls(*specs: tuple[str, str]) -> Reply:
    return reply_tool_calls(*(tool_call(name, arguments) for name, arguments in specs))


def args(**values: object) -> str:
    return json.dumps(values)


ALL_DATES = {"start_date": "2020-01-01", "end_date": "2099-12-31"}
answer_texts = st.integers(0, 99).map(lambda n: f"{ANSWER}{n}")
send = answer_texts.map(lambda text: ("send_message", args(message=text)))

# Calls that succeed: cheap ones (a block edit, an SQL range query) and ones that run the
# real embedder, which take tens of milliseconds each on a busy CPU (used sparingly).
heartbeat_calls = st.sampled_from(
    [
        ("core_memory_append", args(name="human", content="Has a cat.", request_heartbeat=True)),
        ("conversation_search_date", args(**ALL_DATES, request_heartbeat=True)),
    ]
)
cheap_calls = st.one_of(
    send,
    heartbeat_calls,
    st.just(("core_memory_append", args(name="human", content="Likes tea.", request_heartbeat=False))),
)
searches = [
    ("conversation_search", args(query="tea", request_heartbeat=True)),
    ("archival_memory_search", args(query="tea", page=0, request_heartbeat=True)),
]
embedding_calls = st.sampled_from(
    [*searches, ("archival_memory_insert", args(content="The user likes green tea.", request_heartbeat=False))]
)
valid_calls = st.one_of(cheap_calls, embedding_calls)
# Arguments that are not a JSON object at all (often a reply cut off by max_tokens).
not_json_arguments = st.sampled_from(
    ['{"message": "answer: cut', "not json", "{'message': 'single quotes'}", "null", "[1, 2]", "{", '"text"', "{}}"]
)
bad_argument_calls = st.tuples(
    st.sampled_from(["send_message", "core_memory_append", "conversation_search", "archival_memory_insert"]),
    not_json_arguments,
)
unknown_calls = st.tuples(
    st.sampled_from(["send_msg", "", "SEND_MESSAGE", "functions.send_message", "rm -rf /", "süße_funktion", "x" * 300]),
    st.one_of(st.just(args(message=f"{ANSWER}lost")), not_json_arguments),
)
HUGE = 10**30  # a page number the schema allows (no maximum) but SQLite cannot take
# Valid JSON that fails the schema or the function: missing, extra or mistyped arguments,
# values the function refuses.
invalid_calls = st.sampled_from(
    [
        ("send_message", args()),
        ("send_message", args(message="   ")),
        ("send_message", args(message=f"{ANSWER}x", request_heartbeat=True)),
        ("send_message", args(message=42)),
        ("core_memory_append", args(name="nonexistent", content="x", request_heartbeat=True)),
        ("core_memory_replace", args(name="human", old_content="not there", new_content="y", request_heartbeat=True)),
        ("conversation_search", args(query="", request_heartbeat=True)),
        ("conversation_search", args(query="tea", page=-1, request_heartbeat=True)),
        ("conversation_search", args(query="tea", page=HUGE, request_heartbeat=True)),
        ("conversation_search_date", args(start_date="yesterday", end_date="today", request_heartbeat=True)),
        ("conversation_search_date", args(start_date="2099-01-01", end_date="2000-01-01", request_heartbeat=True)),
        ("conversation_search_date", args(**ALL_DATES, page=HUGE, request_heartbeat=True)),
        ("archival_memory_insert", args(content="", request_heartbeat=True)),
        ("archival_memory_search", args(query="tea", page=HUGE, request_heartbeat=True)),
    ]
)


def json_body(body: object) -> Reply:
    return fault_status(200, json.dumps(body), headers={"Content-Type": "application/json"})


def message(**fields: object) -> dict[str, object]:
    return {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **fields}}]}


# HTTP 200 and valid JSON, but not the chat.completion the client expects.
WRONG_SHAPES: list[object] = [
    {},
    [],
    "a string",
    {"choices": []},
    {"choices": None},
    {"choices": [{"index": 0}]},
    {"choices": [{"index": 0, "message": None}]},
    {"error": {"message": "model overloaded", "type": "server_error"}},  # an error sent with status 200
    message(content=42),
    message(content=["a", "list"]),
    message(content=None, tool_calls="oops"),
    message(content=None, tool_calls=[None, 3, {"function": None}, {"id": "c1"}]),
    message(content=None, tool_calls=[{"id": 7, "type": "function", "function": {"name": 5, "arguments": 6}}]),
    # Some OpenAI-compatible servers send the arguments as an object, not a JSON string.
    message(
        tool_calls=[
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "send_message", "arguments": {"message": f"{ANSWER}obj"}},
            }
        ]
    ),
]


@st.composite
def many_calls(draw: st.DrawFn) -> Reply:
    """5-20 calls in one message: valid ones mixed with at least one bad one (so the step
    earns a heartbeat), and at most one that runs the embedder (to keep the run short)."""
    bad = st.one_of(invalid_calls, bad_argument_calls, unknown_calls)
    specs = draw(st.lists(st.one_of(cheap_calls, bad), min_size=3, max_size=18))
    specs.insert(draw(st.integers(0, len(specs))), draw(bad))
    specs.insert(draw(st.integers(0, len(specs))), draw(st.one_of(cheap_calls, embedding_calls)))
    return calls(*specs)


def some_bad_calls(bad: st.SearchStrategy[tuple[str, str]]) -> st.SearchStrategy[Reply]:
    """One to three bad calls, shuffled in with up to two good ones."""
    mixed = st.tuples(st.lists(valid_calls, max_size=2), st.lists(bad, min_size=1, max_size=3))
    return mixed.flatmap(lambda parts: st.permutations(parts[0] + parts[1])).map(lambda specs: calls(*specs))


# What the server answers, per fault class. Transport and body faults make the client
# raise or hand back something that is no completion; the model faults are well-formed
# HTTP 200 completions with a misbehaving model inside.
FAULTS: dict[str, st.SearchStrategy[Reply]] = {
    RATE_LIMIT_RETRY_AFTER: st.sampled_from([RETRY_NOW, {"retry-after": "0.01"}, {"retry-after": "0"}]).map(
        lambda headers: fault_status(429, headers=headers)
    ),
    RATE_LIMIT_BARE: st.just(fault_status(429)),
    SERVER_ERROR: st.one_of(
        st.builds(fault_status, st.sampled_from([500, 502, 503, 504]), st.none(), st.sampled_from([{}, RETRY_NOW])),
        st.just(fault_non_json(status=502)),  # a proxy's HTML error page
    ),
    DISCONNECT: st.just(fault_disconnect()),
    TRUNCATED: st.sampled_from([0.05, 0.5, 0.95]).map(fault_truncated_body),
    NON_JSON: st.sampled_from(
        [
            fault_non_json(),  # an HTML page with status 200
            fault_non_json("OK", content_type="text/plain"),
            fault_non_json("", content_type="application/octet-stream"),
            fault_malformed_json(),
            fault_non_json("<html>not json</html>", content_type="application/json"),
        ]
    ),
    WRONG_SHAPE: st.sampled_from(WRONG_SHAPES).map(json_body),
    PLAIN_TEXT: st.sampled_from(PLAIN_TEXTS).map(reply_text),
    MANY_CALLS: many_calls(),
    BAD_ARGUMENTS: some_bad_calls(bad_argument_calls),
    UNKNOWN_FUNCTION: some_bad_calls(unknown_calls),
    # Heartbeat requests that never reach the person: the step cap ends the chain, or a function
    # loop (the tail cycles through a few calls: one comes again) ends it sooner.
    ENDLESS_HEARTBEAT: st.one_of(heartbeat_calls, invalid_calls).map(lambda spec: calls(spec)),  # failures earn one
    TIMEOUT: st.just(fault_delay(SLOW_REPLY, calls(("send_message", args(message=f"{ANSWER}late"))))),
}
STEP_FAULTS = [fault for fault in FAULTS if fault != ENDLESS_HEARTBEAT]
# What the server keeps answering once the steps run out, besides endless heartbeats. Not
# a flood of calls: 8 steps of 20 calls cost seconds and find nothing one flood does not.
# A timeout for good costs LLM_TIMEOUT on every retry: drawn half as often as the others.
TAIL_FAULTS = [fault for fault in FAULTS if fault not in (MANY_CALLS, ENDLESS_HEARTBEAT, TIMEOUT)] * 2 + [TIMEOUT]


def fault_step(fault: str) -> st.SearchStrategy[Step]:
    return FAULTS[fault].map(lambda reply: Step(fault, reply))


# A well-behaved step answers or asks for a heartbeat. (A step that does neither, say a
# silent archival_memory_insert, ends the chain on purpose: the agent allows that choice,
# so it is no fault and not generated here.)
ok_steps = st.one_of(
    send.map(lambda spec: Step(OK, calls(spec))),
    st.one_of(heartbeat_calls, st.sampled_from(searches)).map(lambda spec: Step(OK, calls(spec))),
    st.tuples(valid_calls, send).map(lambda specs: Step(OK, calls(*specs))),
)
recovers = send.map(lambda spec: (Step(OK, calls(spec)),))


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    # Every fault class equally likely (hypothesis would otherwise favour whichever class
    # has the most alternatives); a third of the steps are good ones. Choices shrink
    # towards the first option: a good step, a recovering model, no retries, a live server.
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 2)) == 0:
            steps.append(draw(ok_steps))
        else:
            steps.append(draw(st.sampled_from(STEP_FAULTS).flatmap(fault_step)))
    # Then: half the time the model recovers, one time in six it asks for heartbeats forever
    # (cycling through a few different calls), otherwise one fault for good.
    tail_kind = draw(st.integers(0, 5))
    if tail_kind <= 2:
        tail: tuple[Step, ...] = draw(recovers)
    elif tail_kind == 3:
        tail = tuple(draw(st.lists(fault_step(ENDLESS_HEARTBEAT), min_size=1, max_size=3)))
    else:
        tail = (draw(st.sampled_from(TAIL_FAULTS).flatmap(fault_step)),)
    return Scenario(
        steps=tuple(steps),
        tail=tail,
        # The client's own retries (their backoff is shortened by the `rig` fixture).
        max_retries=draw(st.sampled_from(RETRIES)),
        refused=draw(st.integers(0, 13)) == 13,
        durable=draw(st.booleans()),
    )


# --------------------------------------------------------------------------- rig


@dataclass
class Rig:
    """One runtime for every example (built once: a runtime per example would cost seconds),
    and one LLM client per (retries, reachable) pair, swapped in per event."""

    runtime: Runtime
    server: FakeLLMServer
    clients: dict[tuple[int, bool], LLMClient]
    ids: Iterator[int] = field(default_factory=itertools.count)


@pytest.fixture
async def rig(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Rig]:
    # Fails loudly if a new openai release renames it (the run would only get slow).
    monkeypatch.setattr(openai._base_client, "INITIAL_RETRY_DELAY", INITIAL_RETRY_DELAY)
    # torch's OpenMP workers spin after every encode: on this 2-core machine they took ~60%
    # of the run's CPU from the event loop and the server (38 s against 14 s for 400 events).
    # One intra-op thread for the run; the vectors are the same.
    torch = pytest.importorskip("torch")
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runtime = await make_runtime(llm_timeout=LLM_TIMEOUT, llm_max_retries=0)
    await runtime.embedder.warm_up()  # the model loads in seconds: not in the first example
    llm_server.keep_requests = False  # thousands of requests: nothing reads them
    with RefusedPort() as refused:
        clients = {
            (retries, refused_): LLMClient(
                runtime.settings.model,
                api_key="test-key",
                base_url=refused.base_url if refused_ else llm_server.base_url,
                timeout=LLM_TIMEOUT,
                max_retries=retries,
            )
            for retries in set(RETRIES)
            for refused_ in (False, True)
        }
        try:
            yield Rig(runtime, llm_server, clients)
        finally:
            llm_server.keep_requests = True
            torch.set_num_threads(torch_threads)
            runtime.services.llm = runtime.llm
            for client in clients.values():
                await client.close()


def is_trouble(text: str) -> bool:
    return "having trouble" in text.lower()


def is_clear_trouble(text: str) -> bool:
    """Says what is wrong, that the message is kept, and that an answer can come later."""
    lower = text.lower()
    return is_trouble(text) and "saved" in lower and any(w in lower for w in ("try again", "retry", "later"))


async def run_scenario(rig: Rig, scenario: Scenario) -> list[str]:
    """Handle one user message under ``scenario``; returns the broken invariants."""
    server, runtime = rig.server, rig.runtime
    server.reset()
    TALLY.start_event()
    server.script(*(Counted(step.fault, step.reply) for step in scenario.steps))
    tail = itertools.cycle([Counted(step.fault, step.reply) for step in scenario.tail])
    server.set_handler(lambda request: next(tail))
    # The agent calls the LLM through its services; the swap is this event's client config.
    runtime.services.llm = rig.clients[(scenario.max_retries, scenario.refused)]

    n = next(rig.ids)
    event = UserMessage(
        platform="terminal",
        user_id=f"prop{n}",
        text=f"hello marker-{n}",
        display_name="prop",
        in_inbox=scenario.durable,
    )
    async with asyncio.timeout(EVENT_DEADLINE):  # a hang fails the example instead of the run
        result = await runtime.handle_with_details(event)

    broken: list[str] = []
    texts = [reply.text for reply in result.replies]
    troubles = [text for text in texts if is_trouble(text)]
    max_steps = runtime.services.max_steps
    if not 1 <= result.steps <= max_steps:
        broken.append(f"{result.steps} steps, cap is {max_steps}")
    if result.hit_step_cap and result.steps != max_steps:
        broken.append(f"hit_step_cap after {result.steps} steps")
    if not texts:
        broken.append("the person got no message at all")
    if len(troubles) > 1:
        broken.append(f"{len(troubles)} trouble notes")
    if troubles and len(texts) > 1:
        broken.append("a trouble note next to real answers")
    broken += [f"unclear trouble note: {text!r}" for text in troubles if not is_clear_trouble(text)]
    broken += [
        f"not a scripted answer: {text!r}"
        for text in texts
        if not is_trouble(text) and ANSWER not in text and text not in PLAIN_TEXTS
    ]
    if scenario.refused and texts != troubles:
        broken.append("answers from a server that refuses connections")
    with TALLY.lock:
        server_failed = scenario.refused or bool(TALLY.current - MODEL_FAULTS)
    if not server_failed and troubles:
        broken.append(f"a trouble note where an answer was possible: {troubles[0]!r}")

    agent = await runtime.agent(event.agent_key)
    stored = [m for m in await runtime.store.messages_since(agent.id, 0) if m.role == "user" and m.name == event.kind]
    if [m.content for m in stored] != [event.render()]:
        broken.append(f"the person's message is stored {len(stored)} times")

    if scenario.refused:  # nothing reaches the server: count the connection attempts here
        for _ in range(1 + scenario.max_retries):
            TALLY.serve(REFUSED)
    TALLY.end_event(
        survived=not broken,
        answered=bool(texts) and not troubles,
        trouble=len(troubles) == 1,
        capped=result.hit_step_cap,
    )
    return broken


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same 1,000 sequences on every run: CI is deterministic
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios())
async def test_any_llm_fault_sequence_gets_one_bounded_clear_answer(rig: Rig, scenario: Scenario) -> None:
    try:
        broken = await run_scenario(rig, scenario)
    except BaseException:
        TALLY.end_event(survived=False, answered=False, trouble=False, capped=False)
        raise
    assert not broken, f"{broken} under {scenario}"


@pytest.fixture(scope="module", autouse=True)
def fault_report(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the per-class table after the module (and write it where the lead asks)."""
    yield
    if not TALLY.total_events:
        return
    table = TALLY.table()
    path = os.environ.get("MEMGPT_FAULT_REPORT")
    if path:
        Path(path).write_text(table + "\n", encoding="utf-8")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print("\n" + table)
    else:
        print("\n" + table)


# --------------------------------------------------------------------------- the bugs it found, pinned


async def test_endless_heartbeats_end_at_the_cap_with_one_note(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # Found by the property: the chain stopped at the cap and the person got nothing. (Here
    # the server answers even the last request, without functions, with a call: no text to send.
    # A new call at every step: the same one again is a function loop, which ends a chain sooner.)
    llm_server.set_handler(
        lambda request: calls(
            ("core_memory_append", args(name="human", content=f"x{len(request['messages'])}", request_heartbeat=True))
        )
    )
    runtime = await make_runtime()
    result = await runtime.handle_with_details(said("hello"))
    assert result.hit_step_cap and result.steps == runtime.settings.max_steps_per_event
    assert [reply.text for reply in result.replies] == [result.trouble]
    assert result.trouble is not None and is_clear_trouble(result.trouble)


async def test_a_function_that_raises_is_a_failed_call_not_a_crash(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # Found by the property: a page number the schema allows overflowed SQLite and the
    # OverflowError escaped the agent.
    llm_server.script(
        calls(("conversation_search_date", args(**ALL_DATES, page=HUGE, request_heartbeat=True))),
        calls(("send_message", args(message="fine"))),
    )
    runtime = await make_runtime()
    result = await runtime.handle_with_details(said("hello"))
    assert [reply.text for reply in result.replies] == ["fine"]
    assert "Failed" in llm_server.requests[1]["messages"][-1]["content"]
    assert "OverflowError" in llm_server.requests[1]["messages"][-1]["content"]


@pytest.mark.parametrize(
    "body",
    [
        message(
            tool_calls=[
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "send_message", "arguments": {"message": "as an object"}},
                }
            ]
        ),
        message(
            content=["as a ", {"type": "text", "text": "list"}],
            tool_calls=[
                {"id": 7, "type": "function", "function": {"name": "send_message", "arguments": '{"message": "ok"}'}}
            ],
        ),
    ],
)
async def test_odd_but_readable_completions_are_coerced(body: object, llm_server: FakeLLMServer) -> None:
    # Found by the property: arguments sent as an object crashed the function executor
    # (`dict.strip`), and a non-string content crashed token counting.
    llm_server.script(json_body(body))
    client = LLMClient("m", api_key="k", base_url=llm_server.base_url, timeout=5, max_retries=0)
    try:
        completion = await client.complete(Request([{"role": "user", "content": "hi"}]))
    finally:
        await client.close()
    assert completion.content is None or isinstance(completion.content, str)
    assert [(call.name, json.loads(call.arguments)["message"]) for call in completion.tool_calls] in (
        [("send_message", "as an object")],
        [("send_message", "ok")],
    )
    assert all(isinstance(call.id, str) and call.id for call in completion.tool_calls)


@pytest.mark.parametrize("body", [None, {"index": 0}, {"choices": [{"index": 0, "message": None}]}])
async def test_completions_without_a_message_are_llm_trouble(body: object, llm_server: FakeLLMServer) -> None:
    # Found by the property: `"message": null` raised AttributeError out of the client.
    llm_server.script(json_body(body))
    client = LLMClient("m", api_key="k", base_url=llm_server.base_url, timeout=5, max_retries=0)
    try:
        with pytest.raises(LLMUnavailableError) as caught:
            await client.complete(Request([{"role": "user", "content": "hi"}]))
    finally:
        await client.close()
    assert is_clear_trouble(caught.value.user_message)


async def test_new_faults_reach_the_client_as_documented(llm_server: FakeLLMServer) -> None:
    """fake_llm's truncated body, non-JSON body and refused port, through the raw client."""
    llm_server.script(fault_truncated_body(), fault_non_json())
    raw = openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0, timeout=5)
    with RefusedPort() as refused:
        down = openai.AsyncOpenAI(base_url=refused.base_url, api_key="k", max_retries=0, timeout=5)
        try:
            request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            with pytest.raises(openai.APIConnectionError):
                await raw.chat.completions.create(**request)
            html = await raw.post("/chat/completions", body=request, cast_to=ChatCompletion)
            assert isinstance(html, str) and "502 Bad Gateway" in html
            with pytest.raises(openai.APIConnectionError):
                await down.chat.completions.create(**request)
        finally:
            await raw.close()
            await down.close()
