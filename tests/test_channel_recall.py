"""What an agent answering in a channel reads of the channel's memory (issue 38):
conversation_search over the channel's lines, and the channel's notes. Through
a real runtime on a real SQLite file, with the local LLM server scripted to
call the functions, and every raw request body read.

Channel context (the recent lines an adapter reads) is off throughout: what
bob's agent knows of alice's words can only come from the channel's memory.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot.events import Event, UserMessage
from bot.runtime import Runtime
from memory.channel_notes import edit_notes, render_notes
from memory.places import DM, Place
from memory.types import Block, BlockLine, ChannelLine, utc_now
from memory.working_context import WorkingContext
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, Reply, reply_text, reply_tool_calls, tool_call
from tests.places_script import SUMMARIZER, new_value

GENERAL = Place("public", "C100", "#general")
RANDOM = Place("public", "C101", "#random")
TEAM = Place("private", "G200", "#team")
ALICE, BOB, CAROL = "T1:UALICE", "T1:UBOB", "T2:UCAROL"
COMMAND = re.compile(r"CMD (find|pages|note|renote|forget|confirm|say) ([^\n]*)")
CODE = re.compile(r"with code '([0-9a-f]+)'")


def scripted(request: dict[str, Any]) -> Reply:
    """CMD find Q: conversation_search(Q); CMD pages N Q: its pages 0..N-1; CMD note T: core_memory_append
    on `channel`; CMD renote OLD => NEW: core_memory_replace there; CMD say: an answer."""
    messages = request.get("messages") or []
    if messages and (messages[0].get("content") or "").startswith(SUMMARIZER):
        return reply_text("Summary.")
    if not request.get("tools"):
        return reply_text("Done.")
    if messages and messages[-1].get("role") == "tool":
        return reply_tool_calls(tool_call("send_message", {"message": "Done."}))
    newest = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    found = COMMAND.findall(newest.get("content") or "")
    verb, text = found[-1] if found else ("say", "")
    text = text.strip()
    if verb == "find":
        return reply_tool_calls(tool_call("conversation_search", {"query": text, "request_heartbeat": True}))
    if verb == "pages":  # pages 0..N-1 in one step: each searches the same memory
        pages, _, query = text.partition(" ")
        calls = [{"query": query, "page": page, "request_heartbeat": True} for page in range(int(pages))]
        return reply_tool_calls(*(tool_call("conversation_search", arguments) for arguments in calls))
    if verb == "forget":  # the chat's two-step forget: the topic, then its code after a yes
        return reply_tool_calls(tool_call("forget_memories", {"topic": text, "request_heartbeat": True}))
    if verb == "confirm":
        codes = [CODE.search(m.get("content") or "") for m in messages if m.get("role") == "tool"]
        code = next(found.group(1) for found in reversed(codes) if found)
        return reply_tool_calls(tool_call("forget_memories", {"code": code, "request_heartbeat": True}))
    if verb == "note":
        arguments = {"name": "channel", "content": text, "request_heartbeat": True}
        return reply_tool_calls(tool_call("core_memory_append", arguments))
    if verb == "renote":
        old, _, new = text.partition(" => ")
        arguments = {"name": "channel", "old_content": old, "new_content": new, "request_heartbeat": True}
        return reply_tool_calls(tool_call("core_memory_replace", arguments))
    return reply_tool_calls(tool_call("send_message", {"message": "Heard you."}))


class Channels:
    """People talking to the bot in places of two workspaces; each event's request bodies kept."""

    def __init__(self, runtime: Runtime, server: FakeLLMServer) -> None:
        self.runtime, self.server = runtime, server

    async def send(self, event: Event) -> list[dict[str, Any]]:
        before = len(self.server.requests)
        await self.runtime.handle(event)
        return self.server.requests[before:]

    def message(self, user: str, text: str, place: Place = DM, workspace: str = "T1") -> UserMessage:
        name = user.split(":U")[-1].lower()
        return UserMessage(
            platform="slack",
            user_id=user,
            text=text,
            display_name=name,
            place=place,
            workspace="" if place.is_dm else workspace,
        )

    async def say(self, user: str, text: str, place: Place = DM, workspace: str = "T1") -> list[dict[str, Any]]:
        return await self.send(self.message(user, text, place, workspace))

    async def heard(
        self, user: str, text: str, place: Place, *, workspace: str = "T1", minutes_ago: int = 60, message_id: str = ""
    ) -> None:
        """A line the channel kept (as a listening channel keeps what it hears)."""
        channel = f"slack:{workspace}:{place.id}"
        line = ChannelLine(
            channel=channel,
            message_id=message_id or new_value(),
            speaker=f"slack:{user}",
            speaker_name=user.split(":U")[-1].lower(),
            text=text,
            said_at=utc_now() - timedelta(minutes=minutes_ago),
            place=place.key,
        )
        assert await self.runtime.channel_memory.keep(line)
        await self.runtime.channel_memory.settle(channel)


def dumps(bodies: list[dict[str, Any]]) -> str:
    return json.dumps(bodies, ensure_ascii=False)


def search_result(bodies: list[dict[str, Any]]) -> str:
    """The conversation_search result the model read (the request after the call)."""
    for body in bodies:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return str(json.loads(last["content"])["result"])
    raise AssertionError("no search result reached the model")


async def test_bob_finds_alices_line_named_as_hers_and_nowhere_else(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(scripted)
    talk = Channels(await make_runtime(), llm_server)
    code, mine, secret = new_value(), new_value(), new_value()
    await talk.heard(ALICE, f"The launch moves to June 3, code name {code}.", GENERAL, minutes_ago=90)
    await talk.heard(BOB, f"I will write the slides for {code} ({mine}).", GENERAL, minutes_ago=30)
    await talk.heard(ALICE, f"In here only: the {code} budget is {secret}.", TEAM)

    # The same channel id in another workspace: asked there first, it finds nothing of T1's.
    elsewhere = await talk.say(BOB, f"CMD find {code} code name there", GENERAL, workspace="T2")
    asked = talk.message(BOB, f"CMD find {code} code name", GENERAL)
    # The listening channel kept bob's question too (Discord: its id is the event's): no hit.
    await talk.heard(BOB, asked.text, GENERAL, message_id=asked.event_id, minutes_ago=0)
    result = search_result(await talk.send(asked))
    assert re.search(rf"\[\d{{4}}-\d\d-\d\d \d\d:\d\d UTC\] alice said in #general: The launch moves .*{code}", result)
    assert f"bob (the person you are answering) said in #general: I will write the slides for {code} ({mine})" in result
    assert "never as this person's" in result
    assert secret not in result, "a private channel's line is not found from another channel"
    assert not [line for line in result.split("\n") if line.endswith(asked.text)], "the question itself is no hit"

    later = await talk.say(BOB, f"CMD find {code} code name")  # his DM
    later += await talk.say(BOB, f"CMD find {code} code name", RANDOM)
    later += await talk.say(CAROL, f"CMD find {code} code name", GENERAL, workspace="T2")
    for bodies in (elsewhere, later):
        assert "June 3" not in dumps(bodies) and mine not in dumps(bodies)

    team = await talk.say(BOB, f"CMD find {code} budget", TEAM)
    assert f"alice said in #team: In here only: the {code} budget is {secret}" in search_result(team)
    after = await talk.say(BOB, f"CMD find {code} budget")
    after += await talk.say(BOB, f"CMD find {code} budget", GENERAL)
    assert secret not in dumps(after), "a private channel's lines never leave it"
    # What bob's recall keeps of those results names no line of the channels.
    record = await talk.runtime.store.find_agent(f"slack:{BOB}")
    assert record is not None
    kept = json.dumps([m.content for m in await talk.runtime.store.messages_since(record.id, 0)])
    assert secret not in kept and "June 3" not in kept and "memory: shown only there" in kept


async def test_pages_of_a_channel_search_neither_overlap_nor_skip(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(scripted)
    talk = Channels(await make_runtime(search_page_size=3), llm_server)
    theirs = [new_value() for _ in range(5)]
    for n, value in enumerate(theirs):
        await talk.heard(ALICE, f"kiwi harvest note {value}", GENERAL, minutes_ago=100 - n)
    own = [new_value() for _ in range(2)]
    for value in own:
        await talk.say(BOB, f"CMD say kiwi harvest reminder {value}", GENERAL)
    bodies = await talk.say(BOB, "CMD pages 6 kiwi harvest", GENERAL)
    after = next(body for body in bodies if body["messages"][-1]["role"] == "tool")
    results = [str(json.loads(m["content"])["result"]) for m in after["messages"][-6:]]
    totals = {int(match) for result in results for match in re.findall(r" of (\d+) from", result)}
    seen = [line for result in results for line in result.split("\n") if line.startswith("- ")]
    values = [value for line in seen for value in theirs + own if value in line]
    assert sorted(values) == sorted(theirs + own), results
    assert len(totals) == 1 and len(seen) == totals.pop() < 18, results
    assert "pages 6 kiwi" not in " ".join(seen), "the question itself is no hit"


async def test_a_note_written_for_alice_shows_in_bobs_channel_prompts_only(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    llm_server.set_handler(scripted)
    talk = Channels(await make_runtime(), llm_server)
    fact, later_fact = new_value(), new_value()
    await talk.say(ALICE, "CMD say hello", GENERAL)  # her conversation here opens before bob's note
    wrote = await talk.say(ALICE, f"CMD note the launch moved to June 3 ({fact})", GENERAL)
    assert "credited to alice" in dumps(wrote[-1:])

    bob_here = await talk.say(BOB, "CMD say hi", GENERAL)
    system = bob_here[0]["messages"][0]["content"]
    assert f"alice: the launch moved to June 3 ({fact})" in system.split("<channel ")[1]

    elsewhere = await talk.say(BOB, "CMD say hi")
    elsewhere += await talk.say(BOB, "CMD say hi", RANDOM)
    elsewhere += await talk.say(BOB, "CMD say hi", TEAM)
    elsewhere += await talk.say(CAROL, "CMD say hi", GENERAL, workspace="T2")
    assert fact not in dumps(elsewhere)
    assert "<channel " not in dumps(elsewhere[:1]), "a DM has no channel block"

    # Bob's agent adds a note: alice's agent, whose prompt was cached before, reads it
    # with the memory status, and its system message keeps its cached text.
    await talk.say(BOB, f"CMD note slides are due Friday ({later_fact})", GENERAL)
    alice_next = await talk.say(ALICE, "CMD say anything new?", GENERAL)
    newest = alice_next[0]["messages"][-1]["content"]
    assert f"+ bob: slides are due Friday ({later_fact})" in newest
    assert later_fact not in alice_next[0]["messages"][0]["content"]
    # Rewritten by bob: the rewritten line is credited to him.
    await talk.say(BOB, f"CMD renote June 3 ({fact}) => June 10 ({fact})", GENERAL)

    restarted = Channels(await make_runtime(tmp_path / "data"), llm_server)
    after = await restarted.say(CAROL.replace("T2", "T1"), "CMD say hi", GENERAL)
    block = after[0]["messages"][0]["content"].split("<channel ")[1]
    assert f"bob: the launch moved to June 10 ({fact})" in block
    assert f"bob: slides are due Friday ({later_fact})" in block
    assert fact not in dumps(await restarted.say(BOB, "CMD say hi"))


def test_an_edit_keeps_credits_it_does_not_touch() -> None:
    lines = [BlockLine("launch June 3", "public:C100", speaker="slack:A", speaker_name="alice")]
    block = Block("channel", limit=200, lines=lines)
    appended = edit_notes(block, lambda c: c.append("channel", "bob: demo Tuesday", GENERAL), GENERAL, "slack:B", "bob")
    assert [(line.text, line.speaker) for line in appended.lines] == [
        ("launch June 3", "slack:A"),
        ("demo Tuesday", "slack:B"),  # the copied credit is not doubled
    ]

    def replace(context: WorkingContext) -> Block:
        return context.replace("channel", "alice: launch June 3", "alice: launch June 10", GENERAL)

    replaced = edit_notes(appended, replace, GENERAL, "slack:B", "bob")
    assert [(line.text, line.speaker_name) for line in replaced.lines] == [
        ("launch June 10", "bob"),
        ("demo Tuesday", "bob"),
    ]
    assert replaced.lines[1] is appended.lines[1]
    assert 'chars="37/200"' in render_notes(replaced, 200)
    too_long = lambda c: c.append("channel", "x" * 300, GENERAL)  # noqa: E731
    try:
        edit_notes(replaced, too_long, GENERAL, "slack:B", "bob")
    except ValueError as error:
        assert "limit is 200" in str(error)
    else:
        raise AssertionError("an edit over the limit is refused")


async def alice_said_the_code_name(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> tuple[Runtime, Channels]:
    """A runtime (channel context off, the scripted model) whose #general kept alice's launch line."""
    llm_server.set_handler(scripted)
    runtime = await make_runtime(channel_context_messages=0)
    talk = Channels(runtime, llm_server)
    await talk.heard(ALICE, "The launch moves to May 3, code name Falcon.", GENERAL)
    return runtime, talk


async def test_a_forgotten_line_leaves_the_loaded_agents_that_were_shown_it(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # Bob's search result is kept as a placeholder, but shown whole while his agent stays
    # loaded: alice's forget passes his door, so his next request is built without it.
    runtime, talk = await alice_said_the_code_name(make_runtime, llm_server)
    assert "Falcon" in search_result(await talk.say(BOB, "CMD find Falcon", GENERAL))
    receipt = await runtime.forget_topic(f"slack:{ALICE}", "Falcon")
    assert receipt.channel_lines == 1
    later = await talk.say(BOB, "CMD say anything new?", GENERAL)
    assert later and "May 3" not in dumps(later)  # her line; "Falcon" is in bob's own question


async def test_forgetting_in_chat_reaches_her_channel_lines(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    # forget_memories, asked in her DM, reaches what channels kept of her, as /forget about: does.
    runtime, talk = await alice_said_the_code_name(make_runtime, llm_server)
    await talk.heard(ALICE, "Lunch is at noon on Fridays.", GENERAL)
    await talk.say(ALICE, "I said the launch is code name Falcon")  # something to match in her own memory
    await talk.say(ALICE, "CMD forget Falcon")
    await talk.say(ALICE, "CMD confirm yes")
    assert await runtime.settle(30) == 0  # the channel part runs after her turn
    kept = [line.text for line in await runtime.channel_memory.speaker_lines(f"slack:{ALICE}")]
    assert kept == ["Lunch is at noon on Fridays."]
