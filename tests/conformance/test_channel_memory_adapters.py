"""Issue 38's story end to end, on every chat platform (tests/chat_platforms.py):
`memgpt-bot run` in its own process against the platform's stand-in, through the
platform's real client library, with channel context off
(MEMGPT_CHANNEL_CONTEXT_MESSAGES=0) and listening channels (SLACK_/DISCORD_LISTEN_CHANNELS).

alice tells #general, without a mention, the launch's new date and its code name;
the channel keeps it without an LLM call and answers only mentions. bob later
mentions the bot there and asks it to search for the code name: the model (the
local server, scripted) calls conversation_search, and the request after it holds
alice's line, named as hers, with its time. Nothing of her lines reaches a request
made for bob's DM, another channel, or the same channel of another workspace
(Slack: the same channel id; Discord: another server); her line in the private
channel is found there only. Her edit and deletion are applied; a restart keeps
the channel's memory. Then `/forget about: CODE` (its question, then the button)
removes her lines and the note credited to her, with every copy, and
`/memory channels off` stops keeping her and deletes the rest: a copy of the data
folder (every table of the SQLite file, every file's bytes) holds no trace of her
words, the inbox and the outbox included; a control scan first finds them there.

What the test reads: what people send and see, the raw bodies the model was sent,
and the data folder (to wait for a line to be kept, and to scan it).
"""

from __future__ import annotations

import json
import re
import secrets
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from bot.channels.listening import LISTENING_NOTICE
from tests.chat_platforms import BotProcess, ChatPlatform
from tests.conformance.test_adapters import WITHIN, bodies_since, bot, platform
from tests.fake_llm import FakeLLMServer, Reply, is_summary_request, reply_text, reply_tool_calls, tool_call
from tests.test_forget_scan import Needles, labels, text_patterns
from tests.test_forget_scrubs_inbox import sqlite_copy_hits

__all__ = ["bot", "platform"]  # fixtures, imported to be found here

COMMAND = re.compile(r"CMD (find|quote|note) ([^\n]*)")
STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d UTC\]"


def word(stem: str) -> str:
    """One word no tokenizer splits nor stemmer shortens, unique to this run."""
    return f"{stem}{secrets.token_hex(5)}0"


def model(request: dict[str, Any]) -> Reply:
    """CMD find Q: conversation_search(Q), then "Done."; CMD quote Q: the same search, then
    an answer quoting each result line naming Q; CMD note T: core_memory_append on the
    channel's notes; anything else: "Heard you."."""
    messages = request.get("messages") or []
    if is_summary_request(request) or not request.get("tools"):
        return reply_text("Summary.")
    newest = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    found = COMMAND.findall(newest.get("content") or "")
    verb, text = found[-1] if found else ("", "")
    text = text.strip()
    if messages and messages[-1].get("role") == "tool":
        answer = "Done."
        if verb == "quote":
            result = str(json.loads(messages[-1]["content"]).get("result", ""))
            answer = "I found: " + " | ".join(line for line in result.splitlines() if text in line)
        return reply_tool_calls(tool_call("send_message", {"message": answer}))
    if verb in ("find", "quote"):
        return reply_tool_calls(tool_call("conversation_search", {"query": text, "request_heartbeat": True}))
    if verb == "note":
        arguments = {"name": "channel", "content": text, "request_heartbeat": True}
        return reply_tool_calls(tool_call("core_memory_append", arguments))
    return reply_tool_calls(tool_call("send_message", {"message": "Heard you."}))


class Story:
    """People in the platform's places, the bot's answers waited for, each event's request bodies kept."""

    def __init__(self, platform: ChatPlatform, bot: BotProcess, llm: FakeLLMServer) -> None:
        self.platform, self.bot, self.llm = platform, bot, llm

    @property
    def database(self) -> Path:
        return self.bot.home / "data" / "memgpt.sqlite3"

    def answers(self, place: str) -> list[str]:
        """The bot's messages in `place`, its listening notice left out."""
        notice = LISTENING_NOTICE[:40]
        return [text for text in self.platform.replies(place) if notice not in text.replace("*", "")]

    def notices(self, place: str) -> int:
        return len(self.platform.replies(place)) - len(self.answers(place))

    def ask(self, place: str, person: str, text: str) -> list[str]:
        """`person` asks (a DM, else a mention); the raw bodies of the requests made for it."""
        before, asked = len(self.answers(place)), len(self.llm.raw_requests)
        if place.startswith("dm:"):
            self.platform.dm(person, text)
        else:
            self.platform.mention(place, person, text)
        self.platform.wait_until(lambda: len(self.answers(place)) > before, WITHIN)
        return bodies_since(self.llm, asked)

    def kept(self, sent: Any) -> str | None:
        """The text the channel's memory holds of a message (None: nothing)."""
        if not self.database.exists():
            return None
        with closing(sqlite3.connect(self.database, timeout=10)) as conn:
            row = conn.execute(
                "SELECT content FROM messages WHERE event_id = ? AND speaker IS NOT NULL",
                (self.platform.message_id(sent),),
            ).fetchone()
        return None if row is None else str(row[0])

    def wait_kept(self, sent: Any, text: str | None) -> None:
        self.platform.wait_until(lambda: self.kept(sent) == text, WITHIN)

    def command(self, person: str, name: str, **options: str) -> str:
        before = len(self.platform.private_answers(person))
        self.platform.command(person, name, **options)
        self.platform.wait_until(lambda: len(self.platform.private_answers(person)) > before, WITHIN)
        return self.platform.private_answers(person)[before]

    def press(self, person: str, label: str, done: str) -> str:
        """`person` presses a button; its answer, which starts with `done` (a "working…" one may come first)."""
        self.platform.press(person, label)
        self.platform.wait_until(lambda: any(a.startswith(done) for a in self.platform.private_answers(person)), WITHIN)
        return next(a for a in self.platform.private_answers(person) if a.startswith(done))

    def scan(self, needles: Needles, name: str) -> set[str]:
        """Every table of a copy of the data folder taken now, and every file's bytes in it."""
        return sqlite_copy_hits(self.bot.home / "data", self.bot.home / name, needles)


def search_result(bodies: list[str]) -> str:
    """The conversation_search result the model read (the request after the call)."""
    for body in bodies:
        last = json.loads(body)["messages"][-1]
        if last["role"] == "tool":
            return str(json.loads(last["content"])["result"])
    raise AssertionError("no search result reached the model")


def test_a_listening_channel_remembers_for_its_members_only_and_forgets_them_on_request(
    platform: ChatPlatform, bot: BotProcess, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(model)
    story = Story(platform, bot, llm_server)
    code, old, new, secret, gone, noted, other, later = (
        word(stem) for stem in ("code", "old", "new", "secret", "gone", "noted", "other", "later")
    )
    # The log file (in the data folder, so scanned) at its default level, INFO: at DEBUG the client
    # libraries log whole payloads into it, which no forget reaches.
    settings = {"MEMGPT_CHANNEL_CONTEXT_MESSAGES": "0", "MEMGPT_LOG_LEVEL": "INFO"}
    bot.extra = settings | platform.listen("public", "private", "other", "far")
    bot.start()

    # alice speaks in listening channels, mentioning nobody: kept, no LLM call, no answer but the notice.
    lines = {
        "launch": ("public", f"The launch moves to June 3, code name {code}, ask {old}."),
        "hiking": ("public", f"I went hiking near {other} on Sunday."),
        "budget": ("private", f"In here only: the {code} budget is {secret}."),
    }
    sent = {name: platform.say(place, "alice", text) for name, (place, text) in lines.items()}
    for name, (_, text) in lines.items():
        story.wait_kept(sent[name], text)
    launch, hiking = sent["launch"], sent["hiking"]
    assert llm_server.raw_requests == []
    platform.wait_until(lambda: story.notices("public") == story.notices("private") == 1, WITHIN)
    assert story.answers("public") == story.answers("private") == []

    # bob asks in #general: the search finds her line, named as hers, with its time.
    found = search_result(story.ask("public", "bob", f"CMD find {code}"))
    assert re.search(rf"{STAMP} Alice said in #general: The launch moves to June 3, code name {code}", found), found
    assert secret not in found  # the private channel's line is not found from #general

    # Nowhere else: bob's DM, another channel, the same channel of another workspace or server.
    elsewhere = story.ask("dm:bob", "bob", f"CMD find {code}")
    elsewhere += story.ask("other", "bob", f"CMD find {code}")
    elsewhere += story.ask("far", "carol", f"CMD find {code}")
    assert len(elsewhere) >= 6  # each searched, and read the results
    for body in elsewhere:
        assert old not in body and "June 3" not in body and secret not in body

    # The private channel's line is found there, and was in no other request.
    here = story.ask("private", "alice", f"CMD find {code} budget")
    assert f"Alice (the person you are answering) said in #team: In here only: the {code} budget is {secret}" in (
        search_result(here)
    )
    assert [body for body in bodies_since(llm_server, 0) if secret in body and body not in here] == []

    # A note credited to alice; then her edit and a deletion, applied.
    story.ask("public", "alice", f"CMD note the launch code name is {code} ({noted})")
    asked = len(llm_server.raw_requests)
    platform.edit(launch, f"The launch moves to June 10, code name {code}, ask {new}.")
    extra = platform.say("public", "alice", f"Also {code} needs {gone}.")
    story.wait_kept(extra, f"Also {code} needs {gone}.")
    platform.delete(extra)
    story.wait_kept(launch, f"The launch moves to June 10, code name {code}, ask {new}.")
    story.wait_kept(extra, None)
    assert len(llm_server.raw_requests) == asked  # listening, editing and deleting make no LLM call

    # A restart keeps it: bob's search finds the edited line, and nothing deleted.
    assert bot.stop()[0] == 0
    bot.start()
    restarted = story.ask("public", "bob", f"CMD quote {code}")
    found = search_result(restarted)
    assert re.search(
        rf"{STAMP} Alice said in #general \(edited\): The launch moves to June 10, code name {code}, ask {new}", found
    )
    assert old not in found and gone not in found
    assert f"Alice: the launch code name is {code} ({noted})" in restarted[0]  # the note, in bob's prompt here
    assert new in story.answers("public")[-1]  # bob's answer quotes her line: the outbox has a copy

    # /forget about: the code name: her lines and note about it go, with every copy.
    topic = Needles(
        {name: text_patterns(value) for name, value in {"new": new, "secret": secret, "noted": noted}.items()}, {}
    )
    before = story.scan(topic, "before-forget")
    assert labels(before) == set(topic.patterns), "the scan cannot see what alice left"
    places = {hit.rsplit(" in table ", 1)[-1] for hit in before if hit.startswith("new in table")}
    assert {"messages", "outbox"} <= places, before
    preview = story.command("alice", "forget", about=code)
    assert secret in preview and noted in preview and other not in preview, preview
    done = story.press("alice", "Delete all of this", "Forgotten:")
    assert "1 note credited to you" in done, done
    assert sorted(story.scan(topic, "after-forget")) == []
    assert story.kept(hiking) == f"I went hiking near {other} on Sunday."  # not about the code name: kept

    # /memory channels off: what is left of her goes, and what she says next is not kept.
    asked = len(llm_server.raw_requests)
    said = story.command("alice", "memory", channels="off")
    assert said.startswith("Done: channels no longer keep what you say"), said
    story.wait_kept(hiking, None)
    after = platform.say("public", "alice", f"One more thing: {later}.")
    barrier = platform.say("public", "bob", "noted, thanks")
    story.wait_kept(barrier, "noted, thanks")
    assert story.kept(after) is None and len(llm_server.raw_requests) == asked
    found = search_result(story.ask("public", "bob", "CMD find hiking"))
    assert other not in found and later not in found
    everything = Needles(
        {
            name: text_patterns(value)
            for name, value in {
                "new": new,
                "old": old,
                "secret": secret,
                "noted": noted,
                "other": other,
                "gone": gone,
                "later": later,
            }.items()
        },
        {},
    )
    assert sorted(story.scan(everything, "after-off")) == []
