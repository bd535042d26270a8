"""What is said in a DM stays in the DM: end to end through the runtime, on
SQLite and on MongoDB (FerretDB), with the scripted model of
tests/places_script.py searching and saving in every place, and every raw
request body scanned.

One person talks to their agent in a DM, a private channel, a second private
channel and a public channel. DM-only text (said, saved to archival, put in
the private block, uploaded in a file, folded into the DM summary by a flush)
must appear in no request made for a channel event, while a DM request still
finds it; a public fact is found from the DM; a private channel's text stays
out of another channel's requests; other people's channel lines are seen for
one event only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.events import ChannelLine, Event, FileUploaded, UserMessage
from bot.llm import LLMClient
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.places import DM, Place
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from memory.types import utc_now
from tests.conftest import make_settings
from tests.fake_llm import FakeLLMServer
from tests.mongo_server import shared_target
from tests.places_script import LeakScanner, new_value, scripted_model

PUBLIC = Place("public", "C100", "#general")
TEAM = Place("private", "G200", "#team")
OTHER = Place("private", "G300", "#other")
USER = "alice"


async def _sqlite(path: Path) -> Store:
    return SQLiteStore(path / "memgpt.sqlite3")


async def _mongodb(path: Path) -> Store:
    return shared_target().store()  # a fresh database, dropped when the store closes


BACKENDS: dict[str, Callable[[Path], Awaitable[Store]]] = {"sqlite": _sqlite, "mongodb": _mongodb}


@pytest.fixture(params=sorted(BACKENDS))
async def runtime(
    request: pytest.FixtureRequest, tmp_path: Path, llm_server: FakeLLMServer, embedder: Embedder
) -> AsyncIterator[Runtime]:
    # A small queue budget: every place's queue is flushed (and summarized) several times.
    settings = make_settings(tmp_path / "data", queue_tokens=1500)
    llm = LLMClient(settings.model, api_key=settings.openai_api_key, base_url=llm_server.base_url, max_retries=0)
    store = await BACKENDS[request.param](tmp_path)
    runtime = await Runtime.create(settings, store=store, llm=llm, embedder=embedder)
    llm_server.set_handler(scripted_model)
    try:
        yield runtime
    finally:
        await runtime.close(close_embedder=False)


class Conversation:
    """Sends events as the one person and files each event's request bodies under its place."""

    def __init__(self, runtime: Runtime, server: FakeLLMServer) -> None:
        self.runtime, self.server, self.scan = runtime, server, LeakScanner()
        self.bodies: list[tuple[Place, list[dict[str, Any]]]] = []

    async def send(self, event: Event) -> list[dict[str, Any]]:
        before = len(self.server.requests)
        await self.runtime.handle(event)
        bodies = self.server.requests[before:]
        self.scan.record(event.place, bodies)
        return bodies

    async def say(self, place: Place, text: str, context: list[ChannelLine] | None = None) -> list[dict[str, Any]]:
        event = UserMessage(platform="slack", user_id=USER, text=text, place=place, channel_context=context or [])
        return await self.send(event)


def dumps(bodies: list[dict[str, Any]]) -> str:
    return json.dumps(bodies, ensure_ascii=False)


async def test_dm_text_never_reaches_a_channel_request(runtime: Runtime, llm_server: FakeLLMServer) -> None:
    talk = Conversation(runtime, llm_server)
    scan = talk.scan
    said, saved, private = scan.secret(DM), scan.secret(DM), scan.secret(DM)
    uploaded, lunch, project = scan.secret(DM), scan.secret(PUBLIC), scan.secret(TEAM)

    await talk.say(DM, f"CMD say my vault code is {said}")
    await talk.say(DM, f"CMD save the locker code is {saved}")
    await talk.say(DM, f"CMD private my clinic code is {private}")
    await talk.send(
        FileUploaded(platform="slack", user_id=USER, filename="notes.txt", text=f"The orchard code is {uploaded}.")
    )
    await talk.say(PUBLIC, f"CMD say the lunch code is {lunch}")
    await talk.say(TEAM, f"CMD save the project code is {project}")
    # Enough DM traffic that the first DM messages leave the queue for the DM summary.
    for round_ in range(4):
        await talk.say(DM, f"CMD find vault code round {round_}")
    dm_now = await talk.say(DM, "CMD say anything new?")
    misses = [] if said in dm_now[0]["messages"][0]["content"] else ["the DM summary holds what was said first"]

    public = await talk.say(PUBLIC, "CMD find vault locker orchard clinic project code")
    other = await talk.say(OTHER, "CMD find vault locker orchard clinic project code")
    team = await talk.say(TEAM, "CMD find project code")
    if lunch not in dumps(public):
        misses.append("a public fact is found in its channel")
    if project not in dumps(team):
        misses.append("a private channel finds its own text")
    if lunch not in dumps(other) + dumps(team):
        misses.append("public text is visible from private channels")

    # From the DM everything is found again.
    for query, value in (("locker", saved), ("orchard", uploaded), ("lunch", lunch), ("project", project)):
        found = await talk.say(DM, f"CMD find {query} code")
        if value not in dumps(found):
            misses.append(f"a DM search for {query!r} finds {value}")
    if private not in dumps(found):
        misses.append("the private block is shown in the DM")

    leaks = scan.leaking_requests()
    assert not leaks, f"{len(leaks)} of {scan.requests_made()} requests leaked: {leaks[:5]}"
    assert not misses


async def test_channel_context_is_seen_once_and_never_kept(runtime: Runtime, llm_server: FakeLLMServer) -> None:
    talk = Conversation(runtime, llm_server)
    theirs = talk.scan.secret(DM)  # nobody's memory may keep it: no request after the event may show it
    lines = [ChannelLine(author="bob", text=f"bob's locker is {theirs}", created_at=utc_now())]
    seen = await talk.say(PUBLIC, "CMD say what is bob's locker?", context=lines)
    assert theirs in dumps(seen[:1]), "the first request of the event shows the channel's lines"
    assert "other people" in dumps(seen[:1])
    later = await talk.say(PUBLIC, "CMD find locker")
    later += await talk.say(DM, "CMD find locker")
    assert theirs not in dumps(later), "channel lines are never stored"
    agent = await runtime.agent(f"slack:{USER}")
    assert theirs not in json.dumps(await runtime.export(agent.record.key), ensure_ascii=False)


SECOND_PUBLIC = Place("public", "C101", "#random")


def system_text(bodies: list[dict[str, Any]]) -> str:
    return str(bodies[0]["messages"][0]["content"])


async def test_a_dm_fact_stays_out_of_channels_whatever_block_holds_it(
    runtime: Runtime, llm_server: FakeLLMServer
) -> None:
    """Issue 18's story: in a DM the model saves a diagnosis in `human` (and a
    note in `persona`); no request for the person's channel mentions carries it."""
    talk = Conversation(runtime, llm_server)
    scan = talk.scan
    diagnosis, locker, promise = scan.secret(DM, "hypothyroidism"), scan.secret(DM), scan.secret(DM)
    team_fact, lunch = scan.secret(TEAM), scan.secret(PUBLIC)
    public_before = system_text(await talk.say(PUBLIC, "CMD say hello"))

    await talk.say(DM, f"CMD human I was diagnosed with {diagnosis}")
    await talk.say(DM, f"CMD human gym locker {locker}")
    await talk.say(DM, f"CMD persona I promised to keep {promise} between us")
    public_after = system_text(await talk.say(PUBLIC, "CMD say hello again"))
    await talk.say(TEAM, f"CMD human works on project {team_fact}")
    await talk.say(PUBLIC, f"CMD human likes the lunch place {lunch}")
    for place in (PUBLIC, SECOND_PUBLIC, OTHER, TEAM):
        await talk.say(place, "CMD say hi")
        await talk.say(place, "CMD find diagnosed locker promised project")

    leaks = scan.leaking_requests()
    assert not leaks, f"{len(leaks)} of {scan.requests_made()} requests leaked: {leaks[:5]}"
    # Each place reads what it may: the DM everything, a private channel its own and public lines.
    dm = system_text(await talk.say(DM, "CMD say how am I doing?"))
    assert all(value in dm for value in (diagnosis, locker, promise, team_fact, lunch))
    team = system_text(await talk.say(TEAM, "CMD say hi team"))
    assert team_fact in team and lunch in team
    assert lunch in system_text(await talk.say(SECOND_PUBLIC, "CMD say hi all"))
    # DM edits change nothing a channel reads, not even a count: its cached prefix stays whole.
    assert public_after == public_before


async def test_a_line_is_shown_everywhere_once_shared(runtime: Runtime, llm_server: FakeLLMServer) -> None:
    talk = Conversation(runtime, llm_server)
    kept, tomatoes = talk.scan.secret(DM), new_value()
    await talk.say(DM, f"CMD human keeps {kept} to themself")
    await talk.say(DM, f"CMD human grows tomatoes {tomatoes}")
    await talk.say(DM, f"CMD share tomatoes {tomatoes}")
    public = system_text(await talk.say(PUBLIC, "CMD say hi"))
    assert tomatoes in public and kept not in public
    # A channel cannot share what it may not read, nor learn that it exists.
    refused = dumps(await talk.say(PUBLIC, "CMD share to themself"))
    assert "not found in block 'human' as shown here" in refused
    assert not talk.scan.leaking_requests()

    # The person shares the other line from /memory, by its id.
    key = f"slack:{USER}"
    human = (await runtime.agent(key)).working_context.get("human")
    line = next(line for line in human.lines if kept in line.text)
    assert line.place == DM.key
    await runtime.share_line(key, "human", line.id)
    assert kept in system_text(await talk.say(PUBLIC, "CMD say hi again"))
