"""Loading files and folders into archival storage: real files, a real SQLite
store, real embeddings (the session's model)."""

from __future__ import annotations

import asyncio
import hashlib
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bot.events import UserMessage
from memory.archival import ArchivalMemory
from memory.embeddings import Embedder
from memory.ingest.chunking import chunk_text
from memory.ingest.loader import load_document, load_paths
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, Reply, reply_tool_calls, tool_call
from tests.helpers import new_agent, user_texts
from tests.test_documents import COUNTER, make_pdf, prose


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    backend = SQLiteStore(tmp_path / "memory.db")
    await backend.open()
    yield backend
    await backend.close()


@pytest.fixture
def archival(store: SQLiteStore, embedder: Embedder) -> ArchivalMemory:
    return ArchivalMemory(store, embedder)


async def stored(store: Store, agent_id: str) -> list[tuple[str | None, str | None, str]]:
    count = await store.count_passages(agent_id)
    return [(p.source, p.position, p.text) for p in await store.list_passages(agent_id, count)]


def write_library(root: Path) -> Path:
    docs = root / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / ".git").mkdir()
    (docs / "guide.md").write_text(
        "# Install\n\n## Linux\n\nRun the installer with sudo.\n\n# Use\n\nStart it daily.\n"
    )
    (docs / "notes.txt").write_text("Basil wants warm nights and morning water.\n")
    (docs / "page.html").write_text(
        "<html><head><script>track()</script></head><body><nav>Menu</nav>"
        "<h1>Pests</h1><p>Aphids hate garlic spray.</p></body></html>"
    )
    book = make_pdf(["Chapter one: seeds.", "Chapter two: soil.", "Frost kills peppers."])
    (docs / "sub" / "book.pdf").write_bytes(book)
    (docs / ".hidden.md").write_text("# Secret\n\nnot for loading")
    (docs / ".git" / "config.md").write_text("# Git\n\nnot for loading either")
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n")
    return docs


# -- formats, positions, folders -------------------------------------------------
async def test_a_folder_of_every_format_loads_with_sources_and_positions(
    store: SQLiteStore, archival: ArchivalMemory, tmp_path: Path
) -> None:
    agent = await new_agent(store, "terminal:maya")
    docs = write_library(tmp_path)
    report = await load_paths(archival, agent.id, [docs], counter=COUNTER, progress=False)

    assert [r.name for r in report.loaded] == ["docs/guide.md", "docs/notes.txt", "docs/page.html", "docs/sub/book.pdf"]
    assert report.skipped == ["docs/photo.png"] and report.failed == [] and report.unchanged == []
    rows = await stored(store, agent.id)
    assert report.passages_added == len(rows) == 7
    assert ("docs/guide.md", "Install > Linux", "# Install\n\n## Linux\n\nRun the installer with sudo.") in rows
    assert ("docs/guide.md", "Use", "# Use\n\nStart it daily.") in rows
    assert ("docs/notes.txt", None, "Basil wants warm nights and morning water.") in rows
    assert ("docs/page.html", "Pests", "# Pests\n\nAphids hate garlic spray.") in rows
    assert [(pos, text) for src, pos, text in rows if src == "docs/sub/book.pdf"] == [
        ("page 1", "Chapter one: seeds."),
        ("page 2", "Chapter two: soil."),
        ("page 3", "Frost kills peppers."),
    ]
    assert not any("not for loading" in text or "track()" in text or "Menu" in text for _, _, text in rows)
    # Vectors were written with the passages: nothing waits for background embedding.
    assert await store.passages_without_embedding(agent.id) == []
    found = await archival.search(agent.id, "what kills pepper plants in winter?", 1)
    top = found.items[0][0]
    assert (top.source, top.position, top.collection) == ("docs/sub/book.pdf", "page 3", None)
    assert [d.name for d in await store.list_documents(agent.id)] == [r.name for r in report.loaded]


async def test_every_passage_carries_source_position_and_load_time(
    store: SQLiteStore, archival: ArchivalMemory, tmp_path: Path
) -> None:
    agent = await new_agent(store, "terminal:maya")
    path = tmp_path / "long.md"
    path.write_text("# Planting\n\n" + "\n\n".join(prose(6, n) for n in range(12)) + "\n\n# Harvest\n\n" + prose(30, 5))
    before = time.time()
    report = await load_paths(
        archival, agent.id, [path], counter=COUNTER, max_tokens=60, overlap_tokens=12, progress=False
    )
    passages = await store.list_passages(agent.id, 1000)
    assert len(passages) == report.passages_added > 8
    assert {p.source for p in passages} == {"long.md"}
    assert {p.position for p in passages} == {"Planting", "Harvest"}
    assert all(COUNTER.count(p.text) <= 60 for p in passages)
    # One load time for the whole load, so a file's passages sort together.
    assert len({p.created_at for p in passages}) == 1 and passages[0].created_at.timestamp() >= before - 1


# -- duplicates, changes, failures -------------------------------------------------
async def test_loading_again_adds_nothing_and_a_changed_file_adds_only_its_new_text(
    store: SQLiteStore, archival: ArchivalMemory, tmp_path: Path
) -> None:
    agent = await new_agent(store, "terminal:maya")
    docs = write_library(tmp_path)
    first = await load_paths(archival, agent.id, [docs], counter=COUNTER, progress=False)
    count = await store.count_passages(agent.id)

    again = await load_paths(archival, agent.id, [docs, docs / "guide.md"], counter=COUNTER, progress=False)
    assert again.passages_added == 0 and len(again.unchanged) == 5 and again.loaded == []
    assert await store.count_passages(agent.id) == count

    # The same bytes under another name are not loaded twice either.
    (tmp_path / "copy.md").write_bytes((docs / "guide.md").read_bytes())
    copy = await load_paths(archival, agent.id, [tmp_path / "copy.md"], counter=COUNTER, progress=False)
    assert copy.unchanged[0].reason == "same content as docs/guide.md"

    with (docs / "guide.md").open("a") as guide:
        guide.write("\n# Upgrade\n\nDownload the new release.\n")
    changed = await load_paths(archival, agent.id, [docs], counter=COUNTER, progress=False)
    [result] = changed.loaded
    assert (result.name, result.passages_added, result.passages_existing) == ("docs/guide.md", 1, 2)
    assert await store.count_passages(agent.id) == count + 1 == first.passages_added + 1


async def test_a_corrupt_pdf_is_reported_by_name_and_the_rest_load(
    store: SQLiteStore, archival: ArchivalMemory, tmp_path: Path
) -> None:
    agent = await new_agent(store, "terminal:maya")
    (tmp_path / "a.md").write_text("# A\n\nFirst good file.")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 4)
    (tmp_path / "c.txt").write_text("Third good file.")
    (tmp_path / "d.pdf").write_bytes(make_pdf(["A good PDF."]))
    paths = [tmp_path / name for name in ("a.md", "broken.pdf", "missing.txt", "c.txt", "d.pdf")]
    report = await load_paths(archival, agent.id, paths, counter=COUNTER, progress=False)

    assert {r.name: r.status for r in report.files} == {
        str(tmp_path / "missing.txt"): "failed",
        "a.md": "loaded",
        "broken.pdf": "failed",
        "c.txt": "loaded",
        "d.pdf": "loaded",
    }
    failures = {r.name: r.reason for r in report.failed}
    assert "not a readable PDF" in failures["broken.pdf"]
    assert failures[str(tmp_path / "missing.txt")] == "no such file or folder"
    assert sorted(text for _, _, text in await stored(store, agent.id)) == [
        "# A\n\nFirst good file.",
        "A good PDF.",
        "Third good file.",
    ]


# -- interrupted loads -----------------------------------------------------------
class FailingEmbedder:
    """The real model, until it breaks after `calls` batches."""

    def __init__(self, real: Embedder, calls: int) -> None:
        self.real = real
        self.calls_left = calls

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.calls_left <= 0:
            raise RuntimeError("model crashed")
        self.calls_left -= 1
        return await self.real.embed(texts)


async def test_an_interrupted_load_resumes_to_exact_counts_without_duplicates(
    store: SQLiteStore, embedder: Embedder, tmp_path: Path
) -> None:
    folder = tmp_path / "books"
    folder.mkdir()
    for n in range(5):
        (folder / f"book{n}.md").write_text(f"# Book {n}\n\n" + "\n\n".join(prose(4, n * 10 + k) for k in range(4)))
    options: dict[str, Any] = {
        "counter": COUNTER,
        "max_tokens": 40,
        "overlap_tokens": 8,
        "progress": False,
        "embed_batch": 8,
        "write_batch": 16,
    }
    reference = await new_agent(store, "terminal:reference")
    clean = await load_paths(store, reference.id, [folder], embedder=embedder, **options)
    assert clean.passages_added > 40

    agent = await new_agent(store, "terminal:maya")
    with pytest.raises(RuntimeError, match="model crashed"):
        await load_paths(store, agent.id, [folder], embedder=FailingEmbedder(embedder, 3), **options)
    partial = await store.count_passages(agent.id)
    assert 0 < partial < clean.passages_added  # what was embedded before the crash was kept
    assert len(await store.list_documents(agent.id)) < 5

    with pytest.raises(RuntimeError, match="model crashed"):  # a second crash, later on
        await load_paths(store, agent.id, [folder], embedder=FailingEmbedder(embedder, 2), **options)
    before_resume = await store.count_passages(agent.id)
    assert partial < before_resume < clean.passages_added

    resumed = await load_paths(store, agent.id, [folder], embedder=embedder, **options)
    assert resumed.passages_added == clean.passages_added - before_resume
    assert await store.count_passages(agent.id) == clean.passages_added
    rows = await stored(store, agent.id)
    assert Counter(rows) == Counter(await stored(store, reference.id))  # same passages, none twice
    assert len(await store.list_documents(agent.id)) == 5
    assert await store.passages_without_embedding(agent.id) == []


# -- uploads -----------------------------------------------------------------------
async def test_an_upload_in_memory_loads_once(store: SQLiteStore, archival: ArchivalMemory) -> None:
    agent = await new_agent(store, "terminal:maya")
    data = make_pdf(["Menu: soup.", "Menu: cake."])
    first = await load_document(archival, agent.id, "menu.pdf", data, "application/pdf", counter=COUNTER)
    assert (first.status, first.passages_added) == ("loaded", 2)
    second = await load_document(archival, agent.id, "menu (1).pdf", data, counter=COUNTER)
    assert (second.status, second.passages, second.reason) == ("unchanged", 2, "same content as menu.pdf")
    broken = await load_document(archival, agent.id, "x.pdf", b"%PDF-garbage", counter=COUNTER)
    assert broken.status == "failed" and "PDF" in broken.reason
    assert await store.count_passages(agent.id) == 2


# -- the bot keeps answering while a collection loads ------------------------------
async def test_a_large_load_never_stalls_the_bots_replies(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    def model(request: dict[str, Any]) -> Reply:
        said = user_texts(request)[-1]
        return reply_tool_calls(tool_call("send_message", {"message": f"echo {said.rsplit(': ', 1)[-1]}"}))

    llm_server.set_handler(model)
    runtime = await make_runtime()
    folder = tmp_path / "library"
    folder.mkdir()
    for n in range(6):
        (folder / f"volume{n}.txt").write_text("\n\n".join(prose(6, n * 100 + k) for k in range(25)))
    source, _ = await runtime.store.create_source("library")
    user = await runtime.agent("terminal:reader")
    await runtime.store.attach_source(source.id, user.id)

    async def chat(turn: int) -> None:
        replies = await runtime.handle(UserMessage(platform="terminal", user_id="reader", text=f"turn {turn}"))
        assert [reply.text for reply in replies] == [f"echo turn {turn}"]
        found = await runtime.archival.search(user.id, "morning water for basil", 3)
        assert all(item.collection == "library" for item, _ in found.items)

    # A first turn before measuring: the model client's cold start is not the loader's doing.
    await chat(0)
    # Between two ticks: the loop thread's own CPU time (what a blocking call
    # in the loop costs, however busy the machine: a thread waiting for a core
    # or for the GIL uses none), and the wall time, with a generous bound.
    cpu_gaps: list[float] = []
    wall_gaps: list[float] = []

    async def ticker() -> None:
        last_cpu, last_wall = time.thread_time(), time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            cpu, wall = time.thread_time(), time.perf_counter()
            cpu_gaps.append(cpu - last_cpu)
            wall_gaps.append(wall - last_wall)
            last_cpu, last_wall = cpu, wall

    ticking = asyncio.create_task(ticker())
    load = asyncio.create_task(
        load_paths(
            runtime.archival,
            source.id,
            [folder],
            counter=COUNTER,
            max_tokens=24,
            overlap_tokens=4,
            progress=False,
        )
    )
    answered_during_load = 0
    for turn in range(1, 13):
        await chat(turn)
        answered_during_load += not load.done()
        if load.done():
            break
        await asyncio.sleep(0.2)  # a person's pace, and a queue that never overflows
    report = await load
    ticking.cancel()

    assert report.passages_added >= 300 and report.failed == []
    assert answered_during_load >= 2
    assert max(cpu_gaps) < 0.2, f"event loop busy for {max(cpu_gaps) * 1000:.0f} ms of CPU between two ticks"
    assert max(wall_gaps) < 10.0, f"event loop held up for {max(wall_gaps):.1f} s"


# -- large files stream -----------------------------------------------------------
class TinyVectors:
    """Deterministic 8-dimension unit vectors from the text. The model's own
    memory is not the loader's to bound, and its vectors (384 floats each)
    would hide the loader's holdings in noise; everything else is real."""

    def __init__(self) -> None:
        self.texts = 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += len(texts)
        rows = [np.frombuffer(hashlib.sha256(text.encode()).digest()[:8], dtype=np.uint8) for text in texts]
        matrix = np.asarray(rows, dtype=np.float32) + 1.0
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def write_book(path: Path, megabytes: float, markdown: bool) -> None:
    with path.open("w") as out:
        written, n = 0, 0
        while written < megabytes * 2**20:
            heading = f"# Chapter {n // 40}\n\n" if markdown and n % 40 == 0 else ""
            paragraph = heading + prose(3 + n % 7, n) + f" Entry {n}.\n\n"
            out.write(paragraph)
            written, n = written + len(paragraph), n + 1


@pytest.mark.parametrize("suffix", [".txt", ".md"])
async def test_a_large_file_streams_in_memory_bounded_whatever_its_size(
    store: SQLiteStore, tmp_path: Path, suffix: str
) -> None:
    agent = await new_agent(store, "terminal:maya")
    book = tmp_path / f"book{suffix}"
    write_book(book, 4, markdown=suffix == ".md")
    size = book.stat().st_size
    embedder = TinyVectors()
    options: dict[str, Any] = {"counter": COUNTER, "max_tokens": 400, "progress": False, "write_batch": 32}

    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        report = await load_paths(store, agent.id, [book], embedder=embedder, **options)
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()

    [result] = report.loaded
    assert result.passages_added == embedder.texts == await store.count_passages(agent.id) > 1000
    # Reading the file whole would hold its bytes and its text (twice its size)
    # and every passage; the stream holds a few windows of passages and parts.
    assert peak < size / 4, f"the loader held {peak / 2**20:.1f} MiB of a {size / 2**20:.1f} MiB file"
    # Streamed in parts, the passages are the ones the whole text chunks into.
    whole = chunk_text(book.read_text(), COUNTER, max_tokens=400)
    assert [p.text for p in await store.list_passages(agent.id, len(whole) + 1)] == [c.text for c in whole]
