"""Shared collections: stored once, read-only for agents, searched together with
each attached agent's own archival passages. Real runtime, store and model;
the command line through real subprocesses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bot.events import UserMessage
from bot.runtime import Runtime
from memory.ingest.loader import load_paths
from memory.store import SourceRecord
from memory.types import Passage
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call
from tests.test_cli import base_env, failed, memgpt, ok
from tests.test_documents import COUNTER, make_pdf

HANDBOOK = (
    "# Watering\n\nWater tomatoes at dawn, never at noon.\n\n"
    "# Pests\n\nAphids on roses go away with a garlic spray.\n\n"
    "# Frost\n\nCover peppers with fleece when frost is forecast.\n"
)


async def handbook(runtime: Runtime, tmp_path: Path, name: str = "handbook") -> SourceRecord:
    source, created = await runtime.store.create_source(name)
    assert created
    path = tmp_path / "garden.md"
    path.write_text(HANDBOOK)
    report = await load_paths(runtime.archival, source.id, [path], counter=COUNTER, progress=False)
    assert report.passages_added == 3
    return source


async def own(runtime: Runtime, user: str, *texts: str) -> str:
    agent = await runtime.agent(user)
    await runtime.archival.insert(agent.id, [Passage(text, source="agent") for text in texts])
    return agent.id


def said(user: str, text: str) -> UserMessage:
    return UserMessage(platform="terminal", user_id=user, text=text)


async def test_an_attached_collection_is_searched_with_the_agents_own_passages(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    runtime = await make_runtime()
    source = await handbook(runtime, tmp_path)
    alice = await own(runtime, "terminal:alice", "Alice grows cherry tomatoes on her balcony.", "Alice's cat is Miso.")
    before = await runtime.archival.search(alice, "tomato watering", 10)
    assert before.total == 2 and {item.collection for item, _ in before.items} == {None}

    await runtime.store.attach_source(source.id, alice)
    found = await runtime.archival.search(alice, "when should I water tomatoes?", 10)
    assert found.total == 5
    scores = [score for _, score in found.items]
    assert scores == sorted(scores, reverse=True)
    top = found.items[0][0]
    assert (top.collection, top.source, top.position) == ("handbook", "garden.md", "Watering")
    origins = {(item.collection, item.source) for item, _ in found.items}
    assert origins == {("handbook", "garden.md"), (None, "agent")}

    # Pages of the merged results fit together: no gaps, nothing twice.
    pages = [await runtime.archival.search(alice, "when should I water tomatoes?", 2, offset) for offset in (0, 2, 4)]
    assert [item.text for page in pages for item, _ in page.items] == [item.text for item, _ in found.items]
    assert all(page.total == 5 for page in pages)

    # The agent's own search function reads the collection too, and names the file.
    llm_server.script(
        reply_tool_calls(tool_call("archival_memory_search", {"query": "aphids on roses", "request_heartbeat": True})),
        reply_tool_calls(tool_call("send_message", {"message": "Garlic spray."})),
    )
    await runtime.handle(said("alice", "What do I do about aphids?"))
    result = json.loads(llm_server.requests[-1]["messages"][-1]["content"])["result"]
    assert "garlic spray" in result and "garden.md, Pests" in result


async def test_an_agent_cannot_write_into_a_collection(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    runtime = await make_runtime()
    source = await handbook(runtime, tmp_path)
    alice = await runtime.agent("terminal:alice")
    await runtime.store.attach_source(source.id, alice.id)
    llm_server.script(
        reply_tool_calls(
            tool_call(
                "archival_memory_insert", {"content": "Alice waters at dusk instead.", "request_heartbeat": False}
            ),
            tool_call("send_message", {"message": "Noted."}),
        )
    )
    await runtime.handle(said("alice", "I water at dusk."))
    assert await runtime.store.count_passages(source.id) == 3
    assert [p.text for p in await runtime.store.list_passages(alice.id, 10)] == ["Alice waters at dusk instead."]
    found = await runtime.archival.search(alice.id, "water at dusk", 1)
    assert found.items[0][0].collection is None


async def test_detaching_removes_the_collection_from_results(make_runtime: RuntimeFactory, tmp_path: Path) -> None:
    runtime = await make_runtime()
    source = await handbook(runtime, tmp_path)
    alice = await own(runtime, "terminal:alice", "Alice likes roses.")
    await runtime.store.attach_source(source.id, alice)
    assert (await runtime.archival.search(alice, "roses", 10)).total == 4
    await runtime.store.detach_source(source.id, alice)
    found = await runtime.archival.search(alice, "roses", 10)
    assert found.total == 1 and found.items[0][0].text == "Alice likes roses."


async def test_another_users_passages_never_appear(make_runtime: RuntimeFactory, tmp_path: Path) -> None:
    runtime = await make_runtime()
    source = await handbook(runtime, tmp_path)
    alice = await own(runtime, "terminal:alice", "Alice's locker code is 4411.")
    bob = await own(runtime, "discord:bob", "Bob's locker code is 9090.")
    await runtime.store.attach_source(source.id, alice)
    await runtime.store.attach_source(source.id, bob)
    for agent, mine, theirs in ((alice, "4411", "9090"), (bob, "9090", "4411")):
        texts = [item.text for item, _ in (await runtime.archival.search(agent, "locker code", 50)).items]
        assert any(mine in text for text in texts)
        assert not any(theirs in text for text in texts)
    # A user the collection is not attached to does not see it at all.
    carol = await own(runtime, "slack:T1:U3", "Carol prefers tulips.")
    assert (await runtime.archival.search(carol, "tomatoes", 50)).total == 1


async def test_attach_all_covers_a_user_created_later(make_runtime: RuntimeFactory, tmp_path: Path) -> None:
    runtime = await make_runtime()
    source = await handbook(runtime, tmp_path)
    early = await own(runtime, "terminal:early", "Early bird.")
    await runtime.store.attach_source(source.id, None)
    late = (await runtime.agent("discord:newcomer")).id
    for agent in (early, late):
        found = await runtime.archival.search(agent, "frost on peppers", 1)
        assert found.items[0][0].collection == "handbook"
    # Detaching one user keeps it attached for everyone else.
    await runtime.store.detach_source(source.id, early)
    assert (await runtime.archival.search(early, "frost on peppers", 10)).total == 1
    assert (await runtime.archival.search(late, "frost on peppers", 10)).total == 3


async def test_a_chat_upload_goes_through_the_same_loader(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    from bot.events import FileUploaded

    llm_server.set_handler(lambda request: reply_tool_calls(tool_call("send_message", {"message": "ok"})))
    runtime = await make_runtime()
    upload: dict[str, Any] = {
        "platform": "discord",
        "user_id": "7",
        "filename": "menu.pdf",
        "data": make_pdf(["Soup of the day.", "Lemon cake."]),
    }
    replies = await runtime.handle(FileUploaded(**upload))
    assert replies[0].text == "Saved menu.pdf to my memory (2 passages)."
    again = await runtime.handle(FileUploaded(**upload))
    assert again[0].text == "Saved menu.pdf to my memory (2 passages)."  # the same file: stored once
    agent = await runtime.agent("discord:7")
    assert await runtime.store.count_passages(agent.id) == 2 and agent.archival_count == 2
    found = await runtime.archival.search(agent.id, "dessert", 1)
    assert (found.items[0][0].text, found.items[0][0].position) == ("Lemon cake.", "page 2")
    broken = await runtime.handle(FileUploaded(**{**upload, "filename": "bad.pdf", "data": b"%PDF-1.4 nonsense"}))
    assert broken[0].text.startswith("I couldn't read bad.pdf: not a readable PDF")


# -- the command line -------------------------------------------------------------
def test_cli_sources_create_load_attach_list_and_search(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    env = base_env(llm_server.base_url, tmp_path / "data", OPENAI_API_KEY="")
    library = tmp_path / "library"
    library.mkdir()
    (library / "garden.md").write_text(HANDBOOK)
    (library / "menu.pdf").write_bytes(make_pdf(["Soup of the day.", "Lemon cake with thyme."]))
    (library / "broken.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 4)
    notes = tmp_path / "notes.txt"
    notes.write_text("Alice keeps her seeds in the blue tin.")

    assert "Created collection garden" in ok(memgpt("sources", "create", "garden", env=env, cwd=tmp_path))
    result = memgpt("sources", "load", "garden", str(library), env=env, cwd=tmp_path)
    error = failed(result)
    assert "1 file of 3 could not be loaded: library/broken.pdf" in error
    assert "library/broken.pdf" in result.stderr and "not a readable PDF" in result.stderr
    assert "Loaded 2 files into collection garden: 5 new passages" in result.stdout

    loaded = json.loads(ok(memgpt("load", "--user", "alice", str(notes), "--json", env=env, cwd=tmp_path)))
    assert loaded["passages_added"] == 1 and loaded["files"][0]["status"] == "loaded"
    assert "every user" in ok(memgpt("sources", "attach", "garden", "--all", env=env, cwd=tmp_path))
    [listed] = json.loads(ok(memgpt("sources", "list", "--json", env=env, cwd=tmp_path)))
    assert (listed["name"], listed["passages"], listed["files"], listed["attach_all"]) == ("garden", 5, 2, True)

    found = json.loads(
        ok(
            memgpt(
                "memory",
                "search",
                "--user",
                "alice",
                "--archival",
                "where are the seeds? and dessert?",
                "--json",
                env=env,
                cwd=tmp_path,
            )
        )
    )
    assert found["total"] == 6
    sources = {item["source"] for item in found["results"]}
    assert {"notes.txt", "library/menu.pdf"} <= sources
    assert llm_server.requests == []


def test_cli_sources_errors_and_management(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    # None of these embed anything, so none loads the model.
    env = base_env(llm_server.base_url, tmp_path / "data", OPENAI_API_KEY="")
    assert "No collections yet" in ok(memgpt("sources", "list", env=env, cwd=tmp_path))
    ok(memgpt("sources", "create", "faq", env=env, cwd=tmp_path))
    assert "already exists" in failed(memgpt("sources", "create", "faq", env=env, cwd=tmp_path))
    missing = failed(memgpt("sources", "load", "nope", str(tmp_path), env=env, cwd=tmp_path))
    assert "no collection named 'nope'" in missing and "sources create nope" in missing

    bad_name = memgpt("sources", "create", "two words", env=env, cwd=tmp_path)
    assert bad_name.returncode == 2 and "bad collection name" in bad_name.stderr
    as_source = memgpt("load", "--user", "source:faq", str(tmp_path), env=env, cwd=tmp_path)
    assert as_source.returncode == 2 and "names a shared collection" in as_source.stderr

    assert "Attached faq to discord:42" in ok(
        memgpt("sources", "attach", "faq", "--user", "discord:42", env=env, cwd=tmp_path)
    )
    assert "faq: 0 passages from 0 files; searched by discord:42" in ok(
        memgpt("sources", "list", env=env, cwd=tmp_path)
    )
    ok(memgpt("sources", "detach", "faq", "--user", "discord:42", env=env, cwd=tmp_path))
    assert "searched by nobody yet" in ok(memgpt("sources", "list", env=env, cwd=tmp_path))
    # Attached to all, then one person detached: the listing says so.
    ok(memgpt("sources", "attach", "faq", "--all", env=env, cwd=tmp_path))
    ok(memgpt("sources", "detach", "faq", "--user", "discord:42", env=env, cwd=tmp_path))
    assert "searched by every user except discord:42" in ok(memgpt("sources", "list", env=env, cwd=tmp_path))
    assert "--yes" in failed(memgpt("sources", "delete", "faq", env=env, cwd=tmp_path))
    assert "Deleted collection faq" in ok(memgpt("sources", "delete", "faq", "--yes", env=env, cwd=tmp_path))
    assert "No collections yet" in ok(memgpt("sources", "list", env=env, cwd=tmp_path))
