"""The `store` fixture: every conformance test runs once per storage backend.

To add a backend, add one async factory to FACTORIES. A factory that needs a
server it cannot reach should call pytest.skip() with the reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from memory.sqlite_store import SQLiteStore
from memory.store import Store


async def _sqlite(tmp_path: Path) -> Store:
    return SQLiteStore(tmp_path / "memory.db")


FACTORIES: dict[str, Callable[[Path], Awaitable[Store]]] = {
    "sqlite": _sqlite,
}


@pytest.fixture(params=sorted(FACTORIES))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend = await FACTORIES[request.param](tmp_path)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()
