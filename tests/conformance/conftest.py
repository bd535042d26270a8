"""The `store` fixture: every conformance test runs once per storage backend.

To add a backend, add one async factory to FACTORIES. A factory that needs a
server it cannot reach should call pytest.skip() with the reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from memory.mongo.store import MongoStore
from memory.sqlite.store import SQLiteStore
from memory.store import Store
from tests.mongo_server import close_shared, shared_target


async def _sqlite(tmp_path: Path) -> Store:
    return SQLiteStore(tmp_path / "memory.db")


async def _mongodb(tmp_path: Path) -> Store:
    # FerretDB started (built if need be) on first use, or MONGODB_TEST_URI;
    # each test gets a fresh database, dropped when the store closes.
    return shared_target().store()


FACTORIES: dict[str, Callable[[Path], Awaitable[Store]]] = {
    "sqlite": _sqlite,
    "mongodb": _mongodb,
}


@pytest.fixture(scope="session", autouse=True)
def _stop_mongo_server() -> Iterator[None]:
    yield
    close_shared()


@pytest.fixture(params=sorted(FACTORIES))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend = await FACTORIES[request.param](tmp_path)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
async def twin(store: Store) -> AsyncIterator[Store]:
    """A second store on the same database with its own connection, as another
    bot process would have (closing it leaves the data alone)."""
    other: Store
    if isinstance(store, SQLiteStore):
        other = SQLiteStore(store.path)
    elif isinstance(store, MongoStore):
        other = shared_target().reopened(store.database)
    else:
        pytest.skip(f"no twin for {type(store).__name__}")
    await other.open()
    try:
        yield other
    finally:
        await other.close()
