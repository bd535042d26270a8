"""How far one Slack message travels through the project's modules, from the
HTTP delivery to its reply confirmed in the outbox (issue 11: "a Slack message
crosses 13 modules and comes back to one it already left 23 times").

Traced with sys.setprofile on the event loop's thread (the SQLite worker
thread's jobs are not counted): every call into a project module (adapters/,
bot/, memory/, cli/) from a different module, or from outside the project, is
an *entry*. `modules` is the number of distinct modules entered, `re_entries`
the entries into a module already entered before. A resumed coroutine is not a
new call. The second message of a person is traced (the first loads the agent).

    pytest tests/test_module_path.py -s    # prints the figures and the path
    MODULE_PATH_CALLS=1 pytest tests/test_module_path.py -s    # and each entry, caller -> callee
"""

from __future__ import annotations

import dis
import functools
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import discord.ext.test as dpytest

from tests import test_discord_adapter as discord_tests
from tests import test_slack_adapter as slack_tests
from tests.fake_llm import FakeLLMServer, say
from tests.test_discord_adapter import Harness
from tests.test_slack_adapter import SlackBot, dm

# The Slack adapter tests' fixtures: a fake Slack Web API and a bot in HTTP mode on a real runtime.
fake_slack = slack_tests.fake_slack
start_bot = slack_tests.start_bot
bot = slack_tests.bot
# The Discord adapter tests' harness: dpytest's gateway and REST stand-in, a real runtime.
discord_bot = discord_tests.discord_bot

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("adapters", "bot", "memory", "cli")
# A generator or coroutine frame past its first RESUME instruction is being resumed, not called.
_RESUMABLE = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR


@functools.cache
def first_resume(code: CodeType) -> int:
    """The offset of a resumable code's first RESUME: a frame at it or before is starting.
    Not a fixed offset: a function whose locals a closure reads begins with MAKE_CELL
    instructions (a fixed 4 took every such coroutine's start for a resumption)."""
    return next(i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")


SHOW_CALLS = bool(os.environ.get("MODULE_PATH_CALLS"))
# A guard against the path growing. Measured at 928fdfa (before the durable pipeline was
# reshaped): 20 modules, 53 re-entries; then 22 and 57 (the pipeline's own modules: inbox,
# outbox, lanes); 23 and 58 with bot.metrics; now 26 and 65: the Slack adapter split by
# job (adapters/slack/: app, adapter, parse, directory, send, where one file and its
# helpers were); 27 and 66 with the SQLite store's shared plumbing in memory/sqlite/base.py;
# 27 and 73 with the prompt-cache layout (the queue manager renders the memory status
# into the newest message); 32 and 99 with places (issue 12: memory.places, whose
# `key` is asked 15 times, bot.conversation, bot.channel_context, the adapter's
# channel history and its cache adapters.lru) and the debounce (bot.durable.debounce).
# A third of the entries are data records (bot.events, memory.types, memory.places).
# 33 and 100 with the one event pipeline (issue 19: adapters.pipeline, where each adapter
# had its own copy of the durable steps; the platform and the pipeline call each other
# across the contract: arrival, build, working, send); 32 and 99 with the bounded caches
# from cachetools (adapters.lru gone).
# 38 and 121 with the LLM layer split by job for servers people self-host (issue 21:
# bot.llm_calls, bot.request_run, bot.request_shape, bot.endpoint, bot.completion, where
# bot/agent.py and bot/llm.py held it) and the in-flight count that shutdown waits on
# (cli.inflight). 39 with the SQLite store's own worker thread (issue 20:
# memory.sqlite.worker, where a ThreadPoolExecutor ran each store call; it runs the
# jobs queued at one wake-up in one transaction and hands results back in one wake-up),
# and 136 re-entries: each of the 16 store calls enters it, as it entered the executor.
# 37 and 129 with the LLM client as one package (issue 37: bot.llm.client, bot.llm.shape,
# bot.llm.types, beside the agent's bot.agent_calls, where six modules were entered);
# 130 when other tests ran first in the same process.
# 111 (112 now and then: the worker's hand-backs depend on its timing) once the data records'
# most read values are attributes, worked out at construction (issue 37: Place.key and
# is_dm, Event.agent_key; memory.types.utc_now a partial, no Python call per Message).
# 34 and 108 (109 now and then) through the agent's door (issue 37: bot.door, where
# bot.runtime, bot.durable.store_wait and bot.durable.quarantine were entered; a DM
# enters no channel-context module); 32 and 104 with the SQLite worker thread in the
# module of the connection it serves (memory.sqlite.base) and Slack's timestamps read by
# its format module (adapters.slack.history is not entered for a DM).
# 100 (101 now and then) with the status line worked out once a step unless an alert or a
# flush changed it (bot/agent_calls.py make_room).
# 30 and 80 (81 or 82 now and then: the worker's hand-backs, other tests first in the process)
# with fewer reads on records (issue 37: the agent's calls read the conversation's queue, not
# Agent.queue; Agent.id and a conversation's visibility attributes; a conversation's key its
# place's), the queue rendering its payloads (memory.types and bot.conversation not entered)
# and a step's record appended to the queue in one call.
# Counted right from here on: a coroutine whose locals a closure reads starts past the
# fixed 4th instruction the tracer took for "resumed" (MAKE_CELL comes first), so the
# start of every such coroutine (most SQLite store calls, with their `job` closures) went
# uncounted. Counted at its first RESUME instead, the same path is 32 and 94 (92 to 94);
# the start (ca159ec) counts 41 and 147 so (39 and 134 the old way), a Discord DM
# 37 and 144 (35 and 130). With a reply's agent key worked out once (bot.events.Reply):
# 32 and 92-94. An answer's tokens counted in one call (TokenCounter.count_answer): 32 and 90
# (91 now and then: the SQLite worker's hand-backs, memory.sqlite.base _Results._deliver,
# one wake-up for the results ready at once, vary with its timing). 32 and 88 with the
# status line's time compared to the minute (no bot.events.stamp unless shown) and a step's
# messages counted in one call (TokenCounter.count_messages); the guard leaves the hand-backs' one.
# Lower these as the path gets shorter.
MAX_MODULES = 32
MAX_RE_ENTRIES = 89
# A Discord DM, measured the same way (dpytest's dispatch, then the adapter): 27 and 89 at
# 74359e1; 28 and 95 through the pipeline; 34 and 117 with the LLM layer and cli.inflight;
# 35 and 132 with memory.sqlite.worker; 33 and 126 with the LLM client as one package;
# 110 (109 now and then) with the attributes above; 30 and 107 (106 now and then) through
# the door; 29 and 101 with the SQLite worker in memory.sqlite.base; 98 with the status
# line worked out once a step; 27 and 77 (78 now and then) with the fewer reads above.
# Counted right (see above): 29 and 90-91; 88-89 with the answer counted in one call;
# 85-86 with the status line's time and a step's messages counted as above.
MAX_DISCORD_MODULES = 29
MAX_DISCORD_RE_ENTRIES = 86


def project_module(filename: str) -> str | None:
    try:
        relative = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    if relative.parts[0] not in PACKAGES:
        return None
    return ".".join(relative.with_suffix("").parts)


@dataclass
class ModulePath:
    entries: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # each entry's caller -> callee (functions)
    _modules: dict[str, str | None] = field(default_factory=dict)

    def module_of(self, frame: FrameType) -> str | None:
        filename = frame.f_code.co_filename
        if filename not in self._modules:
            self._modules[filename] = project_module(filename)
        return self._modules[filename]

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = self.module_of(frame)
        if module is None:
            return
        if frame.f_code.co_flags & _RESUMABLE and frame.f_lasti > first_resume(frame.f_code):
            return
        caller = frame.f_back
        while caller is not None and self.module_of(caller) is None:
            caller = caller.f_back
        if caller is None or self.module_of(caller) != module:
            self.entries.append(module)
            who = f"{self.module_of(caller)}.{caller.f_code.co_qualname}" if caller else "(outside)"
            self.calls.append(f"{who} -> {module}.{frame.f_code.co_qualname}")

    @property
    def modules(self) -> int:
        return len(set(self.entries))

    @property
    def re_entries(self) -> int:
        return len(self.entries) - self.modules


async def trace_one_message(bot: SlackBot, llm_server: FakeLLMServer) -> ModulePath:
    llm_server.set_handler(lambda request: say("hello"))
    assert await bot.event(dm("first"), event_id="EvWarm") == 200
    await bot.texts(1)
    await bot.adapter.drain()
    path = ModulePath()
    sys.setprofile(path.profile)
    try:
        assert await bot.event(dm("second"), event_id="EvTraced") == 200
        await bot.texts(2)
        await bot.adapter.drain()
    finally:
        sys.setprofile(None)
    [sent] = await bot.runtime.store.outbox_for_event("EvTraced")
    assert sent.state == "sent"
    return path


async def test_one_slack_message_crosses_few_modules(bot: SlackBot, llm_server: FakeLLMServer) -> None:
    path = await trace_one_message(bot, llm_server)
    counts = Counter(path.entries)
    print(
        f"\none Slack message: {path.modules} modules entered, {path.re_entries} re-entries"
        f" ({len(path.entries)} entries)\n  "
        + "\n  ".join(f"{module}: {count}" for module, count in counts.most_common())
        + "\n  path: "
        + " > ".join(path.entries)
    )
    if SHOW_CALLS:
        print("\n".join(f"  {call}" for call in path.calls))
    assert path.modules <= MAX_MODULES, counts
    assert path.re_entries <= MAX_RE_ENTRIES, counts


async def test_one_discord_message_crosses_few_modules(discord_bot: Harness) -> None:
    discord_bot.llm.set_handler(lambda request: say("hello"))
    alice = discord_bot.member("alice")
    channel = await alice.create_dm()
    await dpytest.message("first", channel=channel, member=alice)
    path = ModulePath()
    sys.setprofile(path.profile)
    try:
        await dpytest.message("second", channel=channel, member=alice)
    finally:
        sys.setprofile(None)
    assert [m.content for m in discord_tests.sent()] == ["hello", "hello"]
    counts = Counter(path.entries)
    print(
        f"\none Discord message: {path.modules} modules entered, {path.re_entries} re-entries"
        f" ({len(path.entries)} entries)\n  "
        + "\n  ".join(f"{module}: {count}" for module, count in counts.most_common())
    )
    if SHOW_CALLS:
        print("\n".join(f"  {call}" for call in path.calls))
    assert path.modules <= MAX_DISCORD_MODULES, counts
    assert path.re_entries <= MAX_DISCORD_RE_ENTRIES, counts
