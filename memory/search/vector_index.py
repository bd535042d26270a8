"""Exact cosine-similarity search over one agent's passage embeddings, in memory."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

_EPS = 1e-12
_F32 = np.dtype("<f4")  # how embeddings are stored (BLOBs are little-endian float32)


def embedding_matrix(vectors: Sequence[Sequence[float]], stored_dim: int | None = None) -> npt.NDArray[np.float32]:
    """Embeddings to store, as a float32 matrix; ValueError before anything is
    written if they differ in length from each other or from `stored_dim`
    (the length of the embeddings already stored beside them, if any)."""
    if not vectors:
        return np.empty((0, 0), dtype=_F32)
    try:
        matrix = np.asarray(vectors, dtype=_F32)
    except ValueError:  # ragged rows
        matrix = np.empty(0, dtype=_F32)
    if matrix.ndim != 2:
        raise ValueError("embeddings in one call must all have the same length")
    check_dimension(matrix, stored_dim)
    return matrix


def check_dimension(matrix: npt.NDArray[np.float32], stored_dim: int | None) -> None:
    if stored_dim is not None and matrix.shape[1] != stored_dim:
        raise ValueError(f"embedding length {matrix.shape[1]} != stored length {stored_dim}")


def _normalise(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    # A zero vector stays zero (score 0 against everything) instead of NaN.
    normalised: npt.NDArray[np.float32] = matrix / np.maximum(norms, _EPS)
    return normalised


class VectorIndex:
    """Maps integer ids to unit-length float32 vectors; search is a brute-force
    matrix product, exact and fast enough for one agent's archive.

    Rows live in one contiguous matrix that grows by doubling; a removed row is
    filled with the last row so the live rows stay a dense prefix.
    """

    def __init__(self, dim: int | None = None, capacity: int = 64) -> None:
        self._dim = dim
        self._capacity = max(capacity, 1)
        self._size = 0
        self._ids = np.empty(self._capacity, dtype=np.int64)
        self._matrix = np.empty((self._capacity, dim or 0), dtype=np.float32)
        self._row_of: dict[int, int] = {}

    def __len__(self) -> int:
        return self._size

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._row_of

    @property
    def dim(self) -> int | None:
        """Vector length, fixed by the first add (None while never used)."""
        return self._dim

    def add(self, ids: Sequence[int], vectors: npt.ArrayLike) -> None:
        """Insert or replace vectors by id (an id given twice keeps the last)."""
        if not len(ids):
            return
        batch = np.asarray(vectors, dtype=np.float32)
        if batch.ndim != 2 or batch.shape[0] != len(ids):
            raise ValueError(f"expected {len(ids)} vectors as a 2-D array, got shape {batch.shape}")
        if self._dim is None:
            self._dim = int(batch.shape[1])
            self._matrix = np.empty((self._capacity, self._dim), dtype=np.float32)
        elif batch.shape[1] != self._dim:
            raise ValueError(f"vector length {batch.shape[1]} != index dimension {self._dim}")
        last_of = {int(item_id): i for i, item_id in enumerate(ids)}
        self._reserve(self._size + len(last_of))
        rows = np.empty(len(last_of), dtype=np.intp)
        for n, item_id in enumerate(last_of):
            row = self._row_of.get(item_id)
            if row is None:
                row = self._size
                self._row_of[item_id] = row
                self._ids[row] = item_id
                self._size += 1
            rows[n] = row
        self._matrix[rows] = _normalise(batch[list(last_of.values())])

    def remove(self, ids: Iterable[int]) -> None:
        """Drop ids; unknown ids are ignored."""
        for item_id in ids:
            row = self._row_of.pop(int(item_id), None)
            if row is None:
                continue
            last = self._size - 1
            if row != last:
                moved = int(self._ids[last])
                self._ids[row] = moved
                self._matrix[row] = self._matrix[last]
                self._row_of[moved] = row
            self._size = last

    def search(self, query: npt.ArrayLike, k: int, boost: Mapping[int, float] | None = None) -> list[tuple[int, float]]:
        """The k ids most similar to `query`, best first; ties go to the lower id
        so that pages cut from growing k never overlap or skip. `boost` adds a
        bonus to some ids' scores before ranking (the keyword half of a hybrid
        search), so the whole archive is ranked by one exact score."""
        if k <= 0 or self._size == 0:
            return []
        scores = self._scores(query)
        if boost:
            rows = [(self._row_of[item], bonus) for item, bonus in boost.items() if item in self._row_of]
            if rows:
                index, bonus = zip(*rows, strict=True)
                scores[list(index)] += np.asarray(bonus, dtype=np.float32)
        ids = self._ids[: self._size]
        if k < self._size:
            # Keep everything tied with the k-th best so the final order below
            # is a total order (score, then id), whatever argpartition picked.
            kth = scores[np.argpartition(-scores, k - 1)[:k]].min()
            candidates = np.flatnonzero(scores >= kth)
        else:
            candidates = np.arange(self._size)
        order = candidates[np.lexsort((ids[candidates], -scores[candidates]))][:k]
        return [(int(ids[i]), float(scores[i])) for i in order]

    def similarity(self, query: npt.ArrayLike, ids: Iterable[int]) -> dict[int, float]:
        """Cosine of `query` with each of `ids` that the index holds."""
        rows = [(int(item), self._row_of[int(item)]) for item in ids if int(item) in self._row_of]
        if not rows:
            return {}
        q = self._unit_query(query)
        scores = self._matrix[[row for _, row in rows]] @ q
        return {item: float(score) for (item, _), score in zip(rows, scores, strict=True)}

    def vectors(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Copies of the live ids and their unit vectors (to build another index from)."""
        return self._ids[: self._size].copy(), self._matrix[: self._size].copy()

    def _unit_query(self, query: npt.ArrayLike) -> npt.NDArray[np.float32]:
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self._dim:
            raise ValueError(f"query length {q.shape[0]} != index dimension {self._dim}")
        return q / max(float(np.linalg.norm(q)), _EPS)

    def _scores(self, query: npt.ArrayLike) -> npt.NDArray[np.float32]:
        return self._matrix[: self._size] @ self._unit_query(query)

    def _reserve(self, needed: int) -> None:
        if needed <= self._capacity:
            return
        capacity = self._capacity
        while capacity < needed:
            capacity *= 2
        matrix = np.empty((capacity, self._matrix.shape[1]), dtype=np.float32)
        matrix[: self._size] = self._matrix[: self._size]
        ids = np.empty(capacity, dtype=np.int64)
        ids[: self._size] = self._ids[: self._size]
        self._matrix, self._ids, self._capacity = matrix, ids, capacity
