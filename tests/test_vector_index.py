"""VectorIndex against a brute-force numpy reference."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from memory.search.vector_index import VectorIndex


def brute_force(
    reference: dict[int, npt.NDArray[np.float64]], query: npt.NDArray[np.float64], k: int
) -> list[tuple[int, float]]:
    q = query / np.linalg.norm(query)
    scored = [(i, float(v @ q / np.linalg.norm(v))) for i, v in reference.items()]
    return sorted(scored, key=lambda item: (-item[1], item[0]))[:k]


def assert_same_ranking(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_random_adds_removes_and_replacements_match_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    dim = 16
    index = VectorIndex(capacity=4)  # small, so growth happens many times
    reference: dict[int, npt.NDArray[np.float64]] = {}
    next_id = 1
    for _ in range(60):
        op = rng.random()
        if op < 0.6 or not reference:
            count = int(rng.integers(1, 20))
            ids = list(range(next_id, next_id + count))
            next_id += count
            # Some batches also replace existing ids.
            if reference and rng.random() < 0.3:
                ids[0] = int(rng.choice(list(reference)))
            vectors = rng.normal(size=(count, dim)) * rng.uniform(0.1, 10)
            index.add(ids, vectors)
            reference.update(zip(ids, vectors, strict=True))
        else:
            doomed = rng.choice(list(reference), size=min(len(reference), 5), replace=False)
            index.remove([int(i) for i in doomed] + [10**9])  # unknown ids are ignored
            for i in doomed:
                del reference[int(i)]
        assert len(index) == len(reference)
        query = rng.normal(size=dim)
        for k in (1, 7, len(reference) + 3):
            assert_same_ranking(index.search(query, k), brute_force(reference, query, k))


def test_scores_are_cosine_and_scale_free() -> None:
    index = VectorIndex()
    index.add([1, 2, 3], [[3.0, 0.0], [1.0, 1.0], [0.0, -2.0]])
    got = index.search([10.0, 0.0], 3)
    assert [i for i, _ in got] == [1, 2, 3]
    np.testing.assert_allclose([s for _, s in got], [1.0, np.sqrt(0.5), 0.0], atol=1e-6)
    assert index.dim == 2 and 2 in index and 9 not in index


def test_ties_break_by_id_so_pages_never_overlap() -> None:
    index = VectorIndex()
    ids = [50, 10, 40, 20, 30, 60]
    index.add(ids, [[1.0, 0.0]] * len(ids))
    full = index.search([1.0, 0.0], 6)
    assert [i for i, _ in full] == sorted(ids)
    pages = [index.search([1.0, 0.0], k)[k - 2 : k] for k in (2, 4, 6)]
    assert [i for page in pages for i, _ in page] == sorted(ids)


def test_duplicate_id_in_one_batch_keeps_the_last() -> None:
    index = VectorIndex()
    index.add([7, 7], [[1.0, 0.0], [0.0, 1.0]])
    assert len(index) == 1
    [(item, score)] = index.search([0.0, 1.0], 5)
    assert item == 7 and score == pytest.approx(1.0)


def test_zero_vectors_score_zero_instead_of_nan() -> None:
    index = VectorIndex()
    index.add([1, 2], [[0.0, 0.0], [1.0, 0.0]])
    assert index.search([1.0, 0.0], 2) == [(2, pytest.approx(1.0)), (1, 0.0)]
    assert [s for _, s in index.search([0.0, 0.0], 2)] == [0.0, 0.0]


def test_empty_index_and_edge_arguments() -> None:
    index = VectorIndex()
    assert index.search([1.0, 2.0], 5) == [] and len(index) == 0 and index.dim is None
    index.add([], [])
    index.remove([1])
    index.add([1], [[1.0, 2.0]])
    assert index.search([1.0, 2.0], 0) == []
    index.remove([1])
    assert index.search([1.0, 2.0], 3) == [] and len(index) == 0


def test_dimension_and_shape_are_checked() -> None:
    index = VectorIndex()
    index.add([1], [[1.0, 0.0, 0.0]])
    with pytest.raises(ValueError):
        index.add([2], [[1.0, 0.0]])
    with pytest.raises(ValueError):
        index.add([2, 3], [[1.0, 0.0, 0.0]])
    with pytest.raises(ValueError):
        index.search([1.0, 0.0], 1)
    assert len(index) == 1


def test_growth_is_amortised_not_per_insert() -> None:
    index = VectorIndex(capacity=2)
    reallocations = 0
    last = index._matrix
    for n in range(1000):
        index.add([n], [[float(n), 1.0]])
        if index._matrix is not last:
            reallocations += 1
            last = index._matrix
    assert reallocations <= 10  # doubling: log2(1000 / 2)
    index.remove(range(0, 1000, 2))
    assert len(index) == 500
    assert index._matrix.shape[0] >= 500 and index._matrix is last
