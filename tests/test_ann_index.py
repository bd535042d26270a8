"""The approximate index: recall against exact search, changes, persistence,
staleness, and the SQLite store switching to it above its threshold."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from memory.search.ann_index import AnnIndex, Signature
from memory.search.vector_index import VectorIndex
from memory.sqlite.store import SQLiteStore
from memory.types import Block, Passage

DIM = 48


def clustered(n: int, seed: int, dim: int = DIM) -> npt.NDArray[np.float32]:
    """Unit vectors around topics, like sentence embeddings (uniform random
    vectors have no near neighbours worth the name and no index finds them)."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((max(1, n // 50), dim))
    points = topics[rng.integers(len(topics), size=n)] + 0.5 * rng.standard_normal((n, dim))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def recall_at_10(ann: AnnIndex, exact: VectorIndex, queries: npt.NDArray[np.float32]) -> float:
    found = 0
    for query in queries:
        truth = {item for item, _ in exact.search(query, 10)}
        found += len(truth & {item for item, _ in ann.search(query, 10)})
    return found / (10 * len(queries))


def test_recall_at_10_against_exact_search() -> None:
    vectors = clustered(4_000, seed=1)
    ids = np.arange(1, 4_001, dtype=np.int64)
    ann = AnnIndex.build(ids, vectors, threads=2)
    exact = VectorIndex()
    exact.add(ids.tolist(), vectors)
    queries = clustered(4_100, seed=1)[4_000:]  # same topics, not in the index
    assert recall_at_10(ann, exact, queries) >= 0.95
    # Scores are cosines, best first.
    hits = ann.search(queries[0], 5)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert hits[0][1] == pytest.approx(exact.search(queries[0], 1)[0][1], abs=2e-3)


def test_adds_replacements_and_removes_keep_the_signature() -> None:
    vectors = clustered(301, seed=2)  # id n holds vectors[n]; row 0 unused
    ann = AnnIndex(DIM)
    ann.add(list(range(1, 301)), vectors[1:])
    assert ann.signature == Signature(300, sum(range(1, 301)), 300)
    # Replacing a vector keeps its id once and moves it.
    ann.add([7], -vectors[7:8])
    assert len(ann) == 300 and ann.search(-vectors[7], 1)[0][0] == 7
    ann.remove([300, 5, 12345])
    assert ann.signature == Signature(298, sum(range(1, 301)) - 305, 299)
    assert 5 not in ann and 6 in ann
    assert all(item != 5 for item, _ in ann.search(vectors[5], 20))
    sims = ann.similarity(vectors[9], [9, 5, 10])
    assert set(sims) == {9, 10} and sims[9] == pytest.approx(1.0, abs=2e-3)


def test_save_and_load_round_trip_and_refuse_stale_or_unclean_files(tmp_path: Path) -> None:
    vectors = clustered(500, seed=3)
    ann = AnnIndex.build(np.arange(1, 501, dtype=np.int64), vectors)
    path = tmp_path / "agent.usearch"
    ann.save(path)
    loaded = AnnIndex.load(path, ann.signature, DIM)
    assert loaded is not None and len(loaded) == 500
    assert loaded.search(vectors[42], 3) == ann.search(vectors[42], 3)

    assert AnnIndex.load(path, Signature(501, ann.signature.id_sum + 501, 501), DIM) is None
    assert AnnIndex.load(path, ann.signature, DIM + 1) is None
    assert AnnIndex.load(tmp_path / "missing.usearch", ann.signature, DIM) is None

    # A change after the save marks the file unclean at once, before any
    # later save: a crash from then on is detected.
    loaded.add([501], vectors[:1])
    assert json.loads(path.with_suffix(".json").read_text())["clean"] is False
    assert AnnIndex.load(path, ann.signature, DIM) is None
    loaded.save(path)
    assert AnnIndex.load(path, loaded.signature, DIM) is not None

    path.write_bytes(b"not an index")
    assert AnnIndex.load(path, loaded.signature, DIM) is None


# -- inside the SQLite store ------------------------------------------------
THRESHOLD = 300


async def open_store(path: Path) -> SQLiteStore:
    store = SQLiteStore(path, ann_threshold=THRESHOLD)
    await store.open()
    return store


async def fill(store: SQLiteStore, count: int, seed: int, agent_key: str = "t:ann") -> tuple[str, list[int]]:
    agent, _ = await store.get_or_create_agent(agent_key, [Block("human", "", 100)])
    vectors = clustered(count, seed)
    ids = await store.insert_passages(
        agent.id, [Passage(f"note {seed}-{n}", embedding=v.tolist()) for n, v in enumerate(vectors)]
    )
    return agent.id, ids


async def top(store: SQLiteStore, agent_id: str, vector: npt.NDArray[np.float32], text: str = "") -> int:
    page = await store.search_passages(agent_id, text, vector.tolist(), 1)
    return page.items[0][0].id


async def test_store_switches_to_ann_follows_changes_and_reloads_after_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "memory.db"
    store = await open_store(db)
    agent_id, ids = await fill(store, 400, seed=4)
    await store.search_passages(agent_id, "", [1.0] * DIM, 1)
    await store.wait_for_search_indexes()
    entry = store._search.cached(agent_id)
    assert entry is not None and entry.ann is not None and entry.exact is None
    vectors = clustered(400, seed=4)
    assert await top(store, agent_id, vectors[17]) == ids[17]
    # Keywords still count: the exact text lifts a near neighbour over the nearest.
    neighbour = int(np.argsort(-(vectors @ vectors[17]))[1])
    assert await top(store, agent_id, vectors[17], f"note 4-{neighbour}") == ids[neighbour]
    page = await store.search_passages(agent_id, "", vectors[0].tolist(), 5)
    assert 5 < page.total < 400  # the candidate pool, not the archive

    [new_id] = await store.insert_passages(agent_id, [Passage("fresh", embedding=(-vectors[3]).tolist())])
    assert await top(store, agent_id, -vectors[3]) == new_id
    await store.delete_passages(agent_id, [ids[17], new_id])
    assert ids[17] not in [p.id for p, _ in (await store.search_passages(agent_id, "", vectors[17].tolist(), 50)).items]
    # A deleted vector's bytes leave with the ANN file (selective forget); the next
    # search rebuilds it from the rows left, and that one is saved at close.
    assert not store._search.ann_path(agent_id).exists()
    await store.wait_for_search_indexes()
    await store.search_passages(agent_id, "", [1.0] * DIM, 1)
    await store.wait_for_search_indexes()
    await store.close()

    path = store._search.ann_path(agent_id)
    assert path.exists() and json.loads(path.with_suffix(".json").read_text())["clean"] is True

    store = await open_store(db)
    with caplog.at_level(logging.INFO, logger="memory.search.ann_index"):
        assert await top(store, agent_id, vectors[18]) == ids[18]
    entry = store._search.cached(agent_id)
    assert entry is not None and entry.ann is not None and entry.build is None  # loaded, not rebuilt
    assert len(entry.ann) == 399
    assert not any("rebuilt" in record.getMessage() for record in caplog.records)

    await store.delete_agent(agent_id)
    assert not path.exists() and not path.with_suffix(".json").exists()
    await store.close()


async def test_stale_file_is_detected_and_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "memory.db"
    store = await open_store(db)
    agent_id, _ = await fill(store, 350, seed=5)
    await store.search_passages(agent_id, "", [1.0] * DIM, 1)
    await store.wait_for_search_indexes()
    await store.close()
    path = store._search.ann_path(agent_id)
    saved = tmp_path / "saved"
    saved.mkdir()
    for file in (path, path.with_suffix(".json")):
        shutil.copy(file, saved / file.name)

    # More passages arrive (in another process, or before a crash)...
    store = await open_store(db)
    [late] = await store.insert_passages(agent_id, [Passage("late", embedding=[1.0] + [0.0] * (DIM - 1))])
    await store.close()
    # ... and an older index file is what is found on disk.
    for file in saved.iterdir():
        shutil.copy(file, path.parent / file.name)

    store = await open_store(db)
    with caplog.at_level(logging.INFO, logger="memory.search.ann_index"):
        assert await top(store, agent_id, np.array([1.0] + [0.0] * (DIM - 1), dtype=np.float32)) == late
    assert any("stale" in record.getMessage() for record in caplog.records)
    await store.wait_for_search_indexes()
    entry = store._search.cached(agent_id)
    assert entry is not None and entry.ann is not None and len(entry.ann) == 351
    await store.close()


async def test_changes_during_a_build_are_replayed_onto_the_new_index(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "memory.db")
    agent_id, ids = await fill(store, 250, seed=6)
    await store.search_passages(agent_id, "", [1.0] * DIM, 1)
    vectors = clustered(400, seed=6)
    with store._search._build_lock:  # holds the build until the changes below are made
        more = await store.insert_passages(
            agent_id, [Passage(f"more {n}", embedding=v.tolist()) for n, v in enumerate(vectors[250:])]
        )
        entry = store._search.cached(agent_id)
        assert entry is not None and entry.build is not None and entry.ann is None
        # Searches meanwhile are exact, and see every change.
        assert await top(store, agent_id, vectors[260]) == more[10]
        await store.delete_passages(agent_id, [more[10], ids[0]])
        [late] = await store.insert_passages(agent_id, [Passage("late", embedding=(-vectors[1]).tolist())])
    await store.wait_for_search_indexes()
    assert entry.ann is not None and entry.exact is None and len(entry.ann) == 399
    assert more[10] not in entry.ann and ids[0] not in entry.ann and late in entry.ann
    assert await top(store, agent_id, -vectors[1]) == late
    await store.close()
