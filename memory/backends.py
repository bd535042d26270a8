"""Which storage backend a store URL names: the one registry of backends.

    sqlite:PATH                                  the embedded default: one file
    mongodb://HOST[,HOST]/[DATABASE][?OPTIONS]   MongoDB (or mongodb+srv://); database default "memgpt"

`open_store(url)` is the one place a backend is picked: the runtime's store
from its settings (bot/runtime.py), `memgpt-bot migrate --from/--to`
(cli/migrate.py). A new backend is its Store class (in its own wing, beside
memory/sqlite/ and memory/mongo/) and one line in BACKENDS. Each store class
also says whether several bot processes may share it (`serves_many_processes`,
which turns the leases on: bot/durable/leases.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from memory.store import Store, StoreError

DEFAULT_MONGODB_DATABASE = "memgpt"


class StoreURLError(StoreError):
    """A store URL no backend takes."""


@dataclass(frozen=True, slots=True)
class StoreURL:
    scheme: str  # a key of BACKENDS
    location: str  # the file's path, or the server's URI
    database: str = ""

    def same_store(self, other: StoreURL) -> bool:
        if self.scheme == other.scheme == "sqlite":
            return Path(self.location).resolve() == Path(other.location).resolve()
        return self == other


def _sqlite(url: StoreURL) -> Store:
    from memory.sqlite.store import SQLiteStore  # here: each backend loads only when chosen

    return SQLiteStore(url.location)


def _mongodb(url: StoreURL) -> Store:
    from memory.mongo.store import MongoStore

    return MongoStore(url.location, url.database)


BACKENDS: dict[str, Callable[[StoreURL], Store]] = {"sqlite": _sqlite, "mongodb": _mongodb}


def parse_store_url(url: str, *, database: str = "") -> StoreURL:
    """The backend and place a URL names; `database` overrides a MongoDB URI's own
    (MONGODB_DB beside MONGODB_URI: the URI's path is also its login database)."""
    if url.startswith("sqlite:"):
        path = url.removeprefix("sqlite:").removeprefix("//")
        if not path:
            raise StoreURLError(f"store URL {url!r}: no path after 'sqlite:'")
        return StoreURL("sqlite", str(Path(path).expanduser()))
    if url.startswith(("mongodb://", "mongodb+srv://")):
        named = unquote(urlsplit(url).path.lstrip("/"))
        return StoreURL("mongodb", url, database or named or DEFAULT_MONGODB_DATABASE)
    from memory.mongo.capabilities import redact_uri  # a password in a mistyped URL stays hidden

    raise StoreURLError(
        f"store URL {redact_uri(url)!r} is neither sqlite:PATH nor mongodb://HOST[:PORT]/[DATABASE][?OPTIONS]"
    )


def open_store(url: str, *, database: str = "") -> Store:
    """A (not yet opened) store for `url` (see the module docstring)."""
    parsed = parse_store_url(url, database=database)
    return BACKENDS[parsed.scheme](parsed)


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:{path}"
