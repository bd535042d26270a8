"""Hybrid archival search: exact strings and paraphrases, each signal alone
failing one of them, and pages that never push a small window over.

The look-alike corpus uses real MiniLM embeddings. Passages of two UUIDs are
about 64 tokens each, and MiniLM embeds them at 35-70 a second on this 2-core
machine, so 10,000 would take 2-5 minutes per session: the suite uses 2,000
(set MEMGPT_HYBRID_TEST_N=10000 for the full size). Vectors are cached on disk
by content hash in ~/.cache/memgpt-bot, so only the first run on a machine pays for them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from bot.agent import EventResult
from bot.events import UserMessage
from bot.runtime import Runtime
from memory.embeddings import Embedder, bundled_model_path
from memory.search.analysis import keyword_terms
from memory.search.hybrid import STOPWORDS, coverage, fuse, tokens
from memory.sqlite.store import SQLiteStore
from memory.sqlite.terms import indexed_text, term_expressions
from memory.tokens import TokenCounter, load_encoder
from memory.types import Block, Passage
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, Reply, is_summary_request, reply_text, reply_tool_calls, tool_call

CORPUS_SIZE = int(os.environ.get("MEMGPT_HYBRID_TEST_N", "2000"))
SAMPLED_KEYS = 200

FACTS = [
    "Beatrice works as a marine biologist in Lisbon.",
    "My grandfather repaired clocks and watches for forty years.",
    "The cat refuses to eat anything except tuna.",
    "Our flight to Tokyo leaves on the ninth of March.",
    "The car needs new tyres before winter.",
    "I am allergic to peanuts and shellfish.",
]
# Each asks for the fact above it without one content word in common.
PARAPHRASES = [
    "What does her sister do for a living?",
    "Who fixed timepieces?",
    "Which food does the kitten accept?",
    "When do we travel to Japan?",
    "What must be replaced on the automobile?",
    "What food gives me a reaction?",
]


@dataclass(slots=True)
class Corpus:
    texts: list[str]
    keys: list[str]
    vectors: npt.NDArray[np.float32]


def _cached_vectors(embedder: Embedder, texts: list[str]) -> npt.NDArray[np.float32]:
    # Keyed by the model's weights, not its path (every clone has its own venv).
    weights = (Path(bundled_model_path()) / "model.safetensors").read_bytes()
    digest = hashlib.sha256(hashlib.sha256(weights).digest() + "\n".join(texts).encode()).hexdigest()[:16]
    # Beside the suite's other caches (FerretDB, llama.cpp), which outlive /tmp between runs.
    path = Path.home() / ".cache" / "memgpt-bot" / "test-vectors" / f"minilm-{digest}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    # One pytest-xdist worker encodes, the others wait for its file: four workers
    # encoding the same 2,000 texts at once took 50-70 s each on two cores.
    with (path.parent / f"{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return np.load(path)
        vectors = embedder.encode_now(texts)
        partial = path.with_suffix(".partial.npy")
        np.save(partial, vectors)
        partial.replace(path)  # whole or absent, whoever reads it later
        return vectors


@pytest.fixture(scope="session")
def corpus(embedder: Embedder) -> Corpus:
    rng = random.Random(7)

    def new_uuid() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    keys = [new_uuid() for _ in range(CORPUS_SIZE)]
    texts = [f"The value of key {key} is {new_uuid()}." for key in keys]
    return Corpus(texts, keys, _cached_vectors(embedder, texts + FACTS))


@dataclass(slots=True)
class Loaded:
    store: SQLiteStore
    agent_id: str
    ids: list[int]  # corpus passages, then FACTS


@pytest.fixture
async def loaded(tmp_path: Path, corpus: Corpus) -> AsyncIterator[Loaded]:
    store = SQLiteStore(tmp_path / "hybrid.sqlite3")
    await store.open()
    agent, _ = await store.get_or_create_agent("test:hybrid", [Block("human", "", 100)])
    texts = corpus.texts + FACTS
    ids = await store.insert_passages(
        agent.id, [Passage(text, embedding=vector.tolist()) for text, vector in zip(texts, corpus.vectors, strict=True)]
    )
    yield Loaded(store, agent.id, ids)
    await store.close()


def sample(corpus: Corpus) -> list[int]:
    return list(range(0, CORPUS_SIZE, max(1, CORPUS_SIZE // SAMPLED_KEYS)))[:SAMPLED_KEYS]


async def top_id(loaded: Loaded, text: str, vector: npt.NDArray[np.float32]) -> int:
    page = await loaded.store.search_passages(loaded.agent_id, text, vector.tolist(), 1)
    return page.items[0][0].id


# -- the two cases, and each signal alone ------------------------------------
async def test_uuid_found_at_rank_1_and_vector_alone_misses_some(
    loaded: Loaded, corpus: Corpus, embedder: Embedder
) -> None:
    picked = sample(corpus)
    questions = [f"What is the value of key {corpus.keys[n]}?" for n in picked]
    vectors = embedder.encode_now(questions)
    hybrid_misses, vector_misses = [], []
    for n, question, vector in zip(picked, questions, vectors, strict=True):
        if await top_id(loaded, question, vector) != loaded.ids[n]:
            hybrid_misses.append(n)
        if await top_id(loaded, "", vector) != loaded.ids[n]:
            vector_misses.append(n)
    assert hybrid_misses == []
    # Embeddings cannot tell look-alike UUIDs apart reliably (about 2% of
    # these questions at 2,000 passages, 5% at 10,000).
    assert vector_misses, "vector-only search found every key: the corpus is not hard enough to show anything"


async def test_paraphrase_found_without_shared_words_and_keyword_alone_misses(
    loaded: Loaded, embedder: Embedder
) -> None:
    facts = loaded.ids[-len(FACTS) :]
    vectors = embedder.encode_now(PARAPHRASES)
    zero = np.zeros_like(vectors[0])
    for question, fact, target, vector in zip(PARAPHRASES, FACTS, facts, vectors, strict=True):
        shared = (set(tokens(question)) - STOPWORDS) & set(tokens(fact))
        assert not shared, f"{question!r} shares {shared} with {fact!r}"
        assert await top_id(loaded, question, vector) == target, question
        # Keyword only (every cosine 0): the fact earns nothing.
        page = await loaded.store.search_passages(loaded.agent_id, question, zero.tolist(), 5)
        assert target not in [p.id for p, _ in page.items]


async def test_relevance_is_cosine_plus_keyword_bonus(loaded: Loaded, corpus: Corpus, embedder: Embedder) -> None:
    key = corpus.keys[3]
    vector = embedder.encode_now([key])[0]
    hybrid = await loaded.store.search_passages(loaded.agent_id, key, vector.tolist(), 3)
    plain = await loaded.store.search_passages(loaded.agent_id, "", vector.tolist(), 3)
    passage, score = hybrid.items[0]
    assert passage.id == loaded.ids[3]
    cosine = float(np.dot(corpus.vectors[3], vector) / np.linalg.norm(vector))
    # Without query text the relevance is the plain cosine; with it, the
    # exact string adds most of the keyword bonus on top.
    assert plain.items[0][1] == pytest.approx(float(np.max(corpus.vectors @ vector)), abs=1e-5)
    assert score > cosine + 0.3
    assert hybrid.total == plain.total == CORPUS_SIZE + len(FACTS)


# -- pages never push a small window over ------------------------------------
WINDOW = 2_048  # as in tests/test_overflow.py


async def read_two_pages(runtime: Runtime, llm_server: FakeLLMServer) -> EventResult:
    """Seven passages of ~3,000 tokens; the model reads pages 0 and 1, then answers."""
    agent = await runtime.agent("terminal:alice")
    rng = random.Random(3)
    words = ["harbour", "lantern", "copper", "meadow", "violin", "granite", "orchard", "compass"]
    passages = [
        Passage(f"Report {n} about the lighthouse keeper. " + " ".join(rng.choice(words) for _ in range(2_900)))
        for n in range(7)
    ]
    await runtime.archival.insert(agent.id, passages)
    agent.archival_count += len(passages)

    def model(request: dict[str, Any]) -> Reply:
        if is_summary_request(request):
            return reply_text("Alice asked about the lighthouse reports.")
        # Like a real model, go by the page just read: in a small window the
        # previous page may already have been evicted to recall storage, and a
        # memory pressure alert may follow it (a page fills most of a 2,048 window).
        newest = [m for m in request["messages"] if not str(m.get("content") or "").startswith("[system alert]")]
        last = newest[-1]
        just_read = re.search(r"Page (\d+) of pages", last["content"] or "") if last["role"] == "tool" else None
        if just_read is None or just_read.group(1) == "0":
            page = 0 if just_read is None else 1
            args = {"query": "lighthouse keeper", "page": page, "request_heartbeat": True}
            return reply_tool_calls(tool_call("archival_memory_search", args))
        return reply_tool_calls(tool_call("send_message", {"message": "Read two pages."}))

    llm_server.set_handler(model)
    return await runtime.handle_with_details(
        UserMessage(platform="terminal", user_id="alice", text="What do the reports say about the keeper?")
    )


async def test_long_passages_are_shortened_with_a_note_and_no_request_exceeds_the_window(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    runtime = await make_runtime(context_window=WINDOW, response_reserve=128, persona_limit=300, human_limit=300)
    await read_two_pages(runtime, llm_server)
    counter = TokenCounter(load_encoder("test-model"))
    sizes = [counter.count_request(r["messages"], r.get("tools") or []) for r in llm_server.requests]
    assert max(sizes) <= WINDOW, sizes
    agent = await runtime.agent("terminal:alice")
    stored = await runtime.store.messages_since(agent.id, 0)
    first = next(m.content or "" for m in stored if m.role == "tool" and "from archival storage" in (m.content or ""))
    size = runtime.settings.search_page_size
    assert f"Page 0 of pages 0-1: results 1-{size} of 7" in first
    assert f"{7 - size} more: call again with page=1" in first
    shown = first.count("- [")
    assert 1 <= shown <= size
    assert first.count("shortened from") == shown  # every long passage says so; none is cut silently
    if shown < size:  # a small window: fewer results, and the page says so
        assert f"Only the first {shown} of this page fit" in first


# A 2,048-token window leaves a page little room beside the fixed prompt: the
# page budget counts everything that cannot be evicted (bot/agent.py), a page
# shows fewer results rather than cutting them to nothing, and the agent can
# still read on to the next page.
async def test_agent_reads_the_next_page_in_a_small_window(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    runtime = await make_runtime(context_window=WINDOW, response_reserve=128, persona_limit=300, human_limit=300)
    result = await read_two_pages(runtime, llm_server)
    assert [r.text for r in result.replies] == ["Read two pages."]


# -- the keyword query ----------------------------------------------------------
def test_keyword_terms_keep_ids_whole_first_stem_and_drop_function_words() -> None:
    found = keyword_terms("What is the value of key 3f2a9b1c-4e5d-4a6b-8c7d-9e0f1a2b3c4d? Researching it")
    assert found[0] == "3f2a9b1c 4e5d 4a6b 8c7d 9e0f1a2b3c4d"
    assert {"3f2a9b1c", "4e5d", "4a6b", "8c7d", "9e0f1a2b3c4d"} <= set(found)
    assert "valu" in found and "key" in found and "research" in found
    assert not {"what", "is", "the", "of"} & set(found)


def test_sqlite_indexes_each_term_as_one_token() -> None:
    # The identifier is one FTS5 token (its words joined by "_"), and a query
    # term is quoted, so no input is an FTS5 operator.
    assert indexed_text("Locker QX-4471-ZP, researching cafés") == "locker qx 4471 zp qx_4471_zp research cafe"
    assert term_expressions("locker QX-4471-ZP?") == ['"qx_4471_zp"', '"locker"', '"qx"', '"4471"', '"zp"']


@pytest.mark.parametrize(
    "text", ['"', "AND OR NOT", "a* -b", "NEAR(x y)", "col:val", "🦄", "Ünïcödé naïve café", "x" * 5000]
)
async def test_any_query_text_is_safe(loaded: Loaded, text: str) -> None:
    page = await loaded.store.search_passages(loaded.agent_id, text, [0.1] * 384, 3)
    assert len(page.items) == 3


def test_only_function_words_have_no_keyword_side() -> None:
    # Function words are not indexed (as in conversation search): such a
    # query is ranked by meaning alone (tests/conformance has the search).
    assert keyword_terms("The Who") == []
    assert keyword_terms("?! ...") == []


def test_coverage_is_clipped_and_fuse_breaks_ties_by_id() -> None:
    assert coverage({1: 3.0, 2: 30.0, 3: -1.0}, 10.0) == {1: 0.3, 2: 1.0, 3: 0.0}
    assert coverage({1: 3.0}, 0.0) == {}
    assert fuse({5: 0.5, 3: 0.5, 9: 0.1}, {9: 1.0}, weight=0.6) == [(9, pytest.approx(0.7)), (3, 0.5), (5, 0.5)]
