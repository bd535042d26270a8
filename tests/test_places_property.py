"""The visibility rule on every request body, over random sequences of events
across a DM, two private channels and a public channel (SQLite).

The scripted model (tests/places_script.py) says, saves, uploads, puts into
the private block and searches (recall by words and by date, archival) as the
person's messages tell it; each secret is a fresh value tied to the place it
first appeared in. No request made for an event may hold a value its place
may not see (memory/places.py), whatever came before: flushes included (a
small queue budget makes them frequent).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.events import Event, FileUploaded, UserMessage
from bot.llm import LLMClient
from bot.runtime import Runtime
from memory.embeddings import Embedder
from memory.places import DM, Place
from memory.sqlite.store import SQLiteStore
from tests.conftest import make_settings
from tests.fake_llm import FakeLLMServer
from tests.places_script import LeakScanner, scripted_model

PLACES = (DM, Place("private", "G1", "#team"), Place("private", "G2", "#other"), Place("public", "C1", "#general"))
ACTIONS = ("say", "save", "private", "upload", "find")
WORDS = ("vault", "locker", "garden", "bike")

steps = st.lists(
    st.tuples(st.sampled_from(PLACES), st.sampled_from(ACTIONS), st.sampled_from(WORDS)), min_size=2, max_size=6
)


def event_for(index: int, place: Place, action: str, word: str, scan: LeakScanner) -> Event:
    common = {"platform": "slack", "user_id": "T1:U1", "place": place}
    if action == "find":
        return UserMessage(**common, text=f"CMD find {word} code")
    value = scan.secret(place, f"zqv{index:03d}k")
    if action == "upload":
        return FileUploaded(**common, filename=f"{word}.txt", text=f"The {word} code is {value}.")
    return UserMessage(**common, text=f"CMD {action} the {word} code is {value}")


async def run(sequence: list[tuple[Place, str, str]], server: FakeLLMServer, embedder: Embedder) -> LeakScanner:
    scan = LeakScanner()
    with tempfile.TemporaryDirectory() as data:
        config = make_settings(Path(data), queue_tokens=900)
        llm = LLMClient(config.model, api_key=config.openai_api_key, base_url=server.base_url, max_retries=0)
        store = SQLiteStore(Path(data) / "memgpt.sqlite3")
        runtime = await Runtime.create(config, store=store, llm=llm, embedder=embedder)
        try:
            for index, (place, action, word) in enumerate(sequence):
                before = len(server.requests)
                await runtime.handle(event_for(index, place, action, word, scan))
                scan.record(place, server.requests[before:])
        finally:
            await runtime.close(close_embedder=False)
    return scan


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps)
def test_no_request_holds_what_its_place_may_not_see(
    sequence: list[tuple[Place, str, str]], llm_server: FakeLLMServer, embedder: Embedder
) -> None:
    llm_server.reset()
    llm_server.set_handler(scripted_model)
    scan = asyncio.run(run(sequence, llm_server, embedder))
    assert scan.requests_made() >= len(sequence)
    leaks = scan.leaking_requests()
    assert not leaks, f"{len(leaks)} of {scan.requests_made()} requests leaked: {leaks[:3]}"
