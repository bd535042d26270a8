"""What a MongoDB-compatible server can do, found out once when a MongoStore
opens; and how its failures are told to a person (StoreError, no credentials).

Servers differ: a replica set or mongos runs multi-document transactions, a
standalone mongod does not; MongoDB Atlas (and Community with mongot) offers
`$vectorSearch`; FerretDB speaks the wire protocol but has neither, and no text
indexes either. MongoStore picks its code paths from these facts and exposes
them as `store.capabilities`, so tests can assert which path a server exercises.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar
from urllib.parse import unquote

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    ConfigurationError,
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from memory.store import StoreError

log = logging.getLogger(__name__)

RECALL_SEARCH = "terms index + BM25"
VECTOR_SEARCH = "$vectorSearch"
IN_PROCESS_VECTORS = "in-process VectorIndex"


@dataclass(frozen=True, slots=True)
class Capabilities:
    server: str  # "MongoDB 7.0.12" or "FerretDB v1.24.2 (MongoDB 7.0.42 wire)"
    topology: str  # "standalone", "replica set" or "sharded"
    ferretdb: bool
    transactions: bool  # multi-document transactions run (tried, not guessed)
    text_index: bool  # a text index can be created (unused for ranking: see mongo_store)
    vector_search: bool  # the server lists search indexes ($vectorSearch is available)
    recall_search: str = RECALL_SEARCH
    archival_search: str = IN_PROCESS_VECTORS  # or VECTOR_SEARCH, when an index is ready

    def describe(self) -> str:
        def yes(flag: bool) -> str:
            return "yes" if flag else "no"

        return (
            f"{self.server}, {self.topology}; transactions: {yes(self.transactions)}, "
            f"text index: {yes(self.text_index)}, $vectorSearch: {yes(self.vector_search)}; "
            f"recall search: {self.recall_search}; archival search: {self.archival_search}"
        )


async def detect(
    db: AsyncDatabase[Any], vector_index: str | None = None, probe_collection: str = "passages"
) -> Capabilities:
    """Ask the server (`hello`, `buildInfo`) and try what cannot be asked: a
    transaction, a text index on a scratch collection, listing search indexes."""
    hello = await db.command("hello")
    build = await db.command("buildInfo")
    ferret = "ferretdbVersion" in build
    version = str(build.get("version", "?"))
    server = f"FerretDB {build['ferretdbVersion']} (MongoDB {version} wire)" if ferret else f"MongoDB {version}"
    if hello.get("msg") == "isdbgrid":
        topology = "sharded"
    elif hello.get("setName"):
        topology = "replica set"
    else:
        topology = "standalone"
    transactions = topology != "standalone" and await _transactions_work(db)
    text_index = await _text_index_works(db)
    search_indexes = await _search_indexes(db, probe_collection)
    archival = IN_PROCESS_VECTORS
    if vector_index is not None and search_indexes is not None:
        ready = [i for i in search_indexes if i.get("name") == vector_index and i.get("queryable")]
        if ready:
            archival = VECTOR_SEARCH
        else:
            log.warning(
                "MongoDB search index %r on %s is missing or not queryable yet: archival search runs in-process",
                vector_index,
                probe_collection,
            )
    return Capabilities(
        server=server,
        topology=topology,
        ferretdb=ferret,
        transactions=transactions,
        text_index=text_index,
        vector_search=search_indexes is not None,
        archival_search=archival,
    )


async def _transactions_work(db: AsyncDatabase[Any]) -> bool:
    # Some servers announce a replica set but have no transaction commands
    # (FerretDB with --repl-set-name): only a real commit proves it.
    session: AsyncClientSession
    try:
        async with db.client.start_session() as session:
            await session.start_transaction()
            try:
                await db["_memgpt_probe"].find_one({}, session=session)
                await session.commit_transaction()
            except BaseException:
                if session.in_transaction:
                    await session.abort_transaction()
                raise
    except (PyMongoError, NotImplementedError) as exc:
        log.info("MongoDB transactions unavailable: %s", first_line(exc))
        return False
    return True


async def _text_index_works(db: AsyncDatabase[Any]) -> bool:
    scratch = db[f"_memgpt_probe_{uuid.uuid4().hex[:12]}"]
    try:
        await scratch.create_index([("agent_id", 1), ("text", "text")], default_language="none")
        return True
    except OperationFailure:
        return False
    finally:
        try:
            await scratch.drop()
        except PyMongoError as exc:  # leaves an empty scratch collection at worst
            log.debug("could not drop %s: %s", scratch.name, exc)


async def _search_indexes(db: AsyncDatabase[Any], collection: str) -> list[dict[str, Any]] | None:
    """The collection's Atlas Search / vector indexes, or None when the server
    has no search at all ($listSearchIndexes is unknown or unconfigured)."""
    try:
        cursor = await db[collection].aggregate([{"$listSearchIndexes": {}}])
        return await cursor.to_list()
    except OperationFailure:
        return None


_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<rest>.*)$", re.S)


def redact_uri(uri: str) -> str:
    """The URI with any password replaced by ***. Everything up to the last '@'
    counts as user info, so even a password with a stray '@' is hidden."""
    match = _USERINFO.match(uri)
    if not match or "@" not in match["rest"]:
        return uri
    userinfo, _, host = match["rest"].rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{match['scheme']}{user}{':***' if colon else ''}@{host}"


def uri_password(uri: str) -> str | None:
    """The password in the URI, if any (to scrub it from error texts)."""
    match = _USERINFO.match(uri)
    if not match or "@" not in match["rest"]:
        return None
    userinfo = match["rest"].rpartition("@")[0]
    _, colon, password = userinfo.partition(":")
    return password if colon and password else None


def scrub(text: str, uri: str) -> str:
    """`text` with the URI's password (raw and percent-decoded) replaced by ***."""
    password = uri_password(uri)
    if password:
        for secret in {password, unquote(password)}:
            if len(secret) >= 3:  # a 1-2 character "password" would mangle the text
                text = text.replace(secret, "***")
    return text


def first_line(exc: BaseException) -> str:
    """A PyMongo error without its 'full error: {...}' tail and topology dump."""
    text = str(exc).split(", full error:")[0].split(", Timeout:")[0]
    return " ".join(text.split())


def store_error(uri: str, database: str, action: str, exc: PyMongoError) -> StoreError:
    """A PyMongo failure as a StoreError a person can act on, password-free."""
    where = f"MongoDB {redact_uri(uri)} (database {database!r})"
    detail = first_line(exc)
    if isinstance(exc, ServerSelectionTimeoutError):
        text = f"{where} is unreachable: {detail}"
    elif isinstance(exc, ConnectionFailure):
        text = f"{where}: connection lost during {action}: {detail}"
    elif isinstance(exc, ConfigurationError):
        text = f"invalid MongoDB settings for {redact_uri(uri)}: {detail}"
    elif isinstance(exc, OperationFailure) and exc.code in (13, 18):
        text = f"{where}: not allowed ({'authentication failed' if exc.code == 18 else detail})"
    elif isinstance(exc, OperationFailure) and (exc.code == 14031 or "disk" in detail.lower()):
        text = f"{where}: the server is out of disk space ({action}): {detail}"
    else:
        code = f" (code {exc.code})" if isinstance(exc, OperationFailure) and exc.code is not None else ""
        text = f"{where}: {action} failed: {detail}{code}"
    return StoreError(scrub(text, uri))


class _ReportsErrors(Protocol):
    def error(self, action: str, exc: PyMongoError) -> StoreError: ...


S = TypeVar("S", bound=_ReportsErrors)
P = ParamSpec("P")
R = TypeVar("R")


def guarded(
    fn: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Method decorator: PyMongo errors leave as `self.error(method name, exc)`."""

    @functools.wraps(fn)
    async def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(self, *args, **kwargs)
        except PyMongoError as exc:
            raise self.error(fn.__name__, exc) from exc

    return wrapper
