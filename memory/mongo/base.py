"""Plumbing shared by the parts of the MongoDB backend (the design is told in
memory/mongo/store.py): value conversions, the store's state, error mapping,
transactions where the server has them, and the agent document.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
import weakref
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from cachetools import LRUCache
from pymongo import AsyncMongoClient, UpdateOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

from memory.mongo.capabilities import Capabilities, redact_uri, store_error
from memory.places import PUBLIC_END, PUBLIC_PREFIX, Visibility
from memory.search.vector_index import VectorIndex
from memory.store import StoreError

log = logging.getLogger("memory.mongo.store")

T = TypeVar("T")
Doc = dict[str, Any]
Session = AsyncClientSession | None

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
MAX_ATTEMPTS = 100  # insert races lost in a row before giving up
LIVE: Doc = {"deleting": {"$ne": True}}  # agents not being deleted


def visible_filter(visible: Visibility | None) -> Doc:
    """The Visibility as a query filter on `place`, to merge into a query
    beside agent_id ({} when everything is visible)."""
    if visible is None or visible.everything:
        return {}
    terms: list[Doc] = [{"place": {"$in": sorted(visible.places)}}] if visible.places else []
    if visible.public:
        terms.append({"place": {"$gte": PUBLIC_PREFIX, "$lt": PUBLIC_END}})
    if not terms:
        return {"place": {"$in": []}}
    return terms[0] if len(terms) == 1 else {"$or": terms}


# Updates sent per bulk write. FerretDB 1.24 (SQLite) never answers a bulk
# write of 128 updates (64 take a second or two): measured with 384-float
# embeddings and with 8-float ones alike, so it is the count, not the size.
WRITE_BATCH = 50


async def update_by_id(collection: AsyncCollection[Doc], updates: list[tuple[Any, Doc]]) -> None:
    """Apply (document _id, $set fields) pairs, WRITE_BATCH to a bulk write.
    By _id: the one filter FerretDB answers from its primary key (any other
    makes each update scan the collection, parsing every stored embedding)."""
    for start in range(0, len(updates), WRITE_BATCH):
        batch = updates[start : start + WRITE_BATCH]
        operations = [UpdateOne({"_id": key}, {"$set": fields}) for key, fields in batch]
        await collection.bulk_write(operations, ordered=False)


def to_us(moment: datetime) -> int:
    """Microseconds since the epoch: a BSON date would keep only milliseconds.
    A naive datetime is taken as UTC, as the SQLite store does."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


class LostRace(Exception):
    """Another writer inserted the keys we reserved first: read again and retry."""


def lost_race(exc: BulkWriteError) -> bool:
    """True when the insert failed only on duplicate keys (another writer won)."""
    errors = exc.details.get("writeErrors", [])
    return bool(errors) and all(error.get("code") == 11000 for error in errors)


class MongoBase:
    def __init__(
        self,
        uri: str,
        database: str = "memgpt",
        *,
        server_selection_timeout: float = 10.0,
        max_cached_indexes: int = 256,
        vector_search_index: str | None = None,
    ) -> None:
        """`vector_search_index`: the name of an Atlas Vector Search index on
        passages.embedding (with agent_id as a filter field, see
        docs/mongodb.md); used when the server reports it queryable."""
        self._uri = uri
        self.database = database
        self.redacted_uri = redact_uri(uri)
        self._timeout_ms = max(int(server_selection_timeout * 1000), 1)
        self._vector_index = vector_search_index
        self._client: AsyncMongoClient[Doc] | None = None
        self._db: AsyncDatabase[Doc] | None = None
        self.capabilities: Capabilities | None = None
        # agent id -> (index, the agent's vector version it reflects)
        self._indexes: LRUCache[str, tuple[VectorIndex, int]] = LRUCache(max(max_cached_indexes, 1))
        # agent id -> its newest message this process saw (seq, batch_end, tok_total; see _newest_message)
        self._newest: LRUCache[str, Doc] = LRUCache(4096)
        # One append at a time per agent inside this process: the unique index
        # settles races between processes, the lock spares us losing them here.
        self._append_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._hash_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._id_lock = asyncio.Lock()
        self._last_created = 0

    def __repr__(self) -> str:
        return f"MongoStore({self.redacted_uri!r}, {self.database!r})"

    # -- plumbing ----------------------------------------------------------
    def error(self, action: str, exc: PyMongoError) -> StoreError:
        return store_error(self._uri, self.database, action, exc)

    def _c(self, name: str) -> AsyncCollection[Doc]:
        if self._db is None:
            raise StoreError(f"MongoDB store {self.redacted_uri} is not open")
        return self._db[name]

    def collection(self, name: str) -> AsyncCollection[Doc]:
        """A collection of this store's database, for modules that keep their
        own documents beside memory (check-in schedules)."""
        return self._c(name)

    # Bulk updates by _id (see update_by_id), as a method for the store's parts.
    _update_by_id = staticmethod(update_by_id)

    async def _atomic(self, work: Callable[[Session], Awaitable[T]]) -> T:
        """Run `work` in a transaction where the server has them, else as is."""
        if self._client is None or self.capabilities is None or not self.capabilities.transactions:
            return await work(None)
        async with self._client.start_session() as session:
            return await session.with_transaction(work)

    async def _require_agent(self, agent_id: str, session: Session = None) -> None:
        # What the SQLite foreign keys do: nothing is stored for a missing agent.
        if await self._c("agents").find_one({"_id": agent_id, **LIVE}, {"_id": 1}, session=session) is None:
            raise StoreError(f"MongoDB store: no agent {agent_id!r}")

    async def _newest_message(self, agent_id: str, event_id: str | None, session: Session) -> tuple[Doc | None, bool]:
        """The agent's newest message (seq, batch_end, tok_total), and whether a
        message of `event_id` is stored. One query when this process saw the
        agent's newest before: every message from that one on (the newest of
        them is the agent's newest) and the event's; a plain read of the newest
        only when that one is gone (forgotten) or was never seen here.

        With `event_id`, the newest is always read before the event's message is
        looked for: a message of the event that another writer stores between the
        two reads has a higher seq, so the second read finds it too, and one stored
        after both took the seq the caller's insert will want (a lost race). The
        other order let two processes keep one channel line twice: the event not
        found, then the other's message read as the newest, and ours put after it."""
        messages, fields = self._c("messages"), {"seq": 1, "batch_end": 1, "tok_total": 1, "event_id": 1}
        known = self._newest.get(agent_id)
        seen = None if known is None else known["seq"]
        if seen is None and event_id is not None:
            newest = await messages.find_one({"agent_id": agent_id}, fields, sort=[("seq", -1)], session=session)
            seen = 0 if newest is None else newest["seq"]
        found: list[Doc] = []
        if seen is not None or event_id is not None:
            either = ([{"seq": {"$gte": seen}}] if seen is not None else []) + (
                [{"event_id": event_id}] if event_id is not None else []
            )
            where = {"agent_id": agent_id, **({"$or": either} if len(either) > 1 else either[0])}
            found = [doc async for doc in messages.find(where, fields, session=session)]
        if event_id is not None and any(doc.get("event_id") == event_id for doc in found):
            return None, True
        recent = [doc for doc in found if seen is not None and doc["seq"] >= seen]
        if not recent and event_id is not None and known is not None:
            # The newest seen here is gone (forgotten): read the newest first, as above.
            self._newest.pop(agent_id, None)
            return await self._newest_message(agent_id, event_id, session)
        newest = (
            max(recent, key=lambda doc: int(doc["seq"]))
            if recent
            else await messages.find_one({"agent_id": agent_id}, fields, sort=[("seq", -1)], session=session)
        )
        if newest is not None:
            self._newest[agent_id] = newest
        return newest, False

    @staticmethod
    async def _backoff(attempt: int) -> None:
        await asyncio.sleep(random.uniform(0, min(0.002 * attempt, 0.05)))

    async def _agent_doc(self, key: str, ready: bool = False) -> Doc:
        """The agent document for `key`, inserted if missing (the unique key
        index settles concurrent inserts: the losers read the winner's)."""
        agents = self._c("agents")
        for _ in range(MAX_ATTEMPTS):
            doc = await agents.find_one({"key": key, **LIVE})
            if doc is not None:
                return doc
            now = to_us(datetime.now(UTC))
            self._last_created = max(now, self._last_created + 1)  # list_agents order, within a process
            doc = {
                "_id": uuid.uuid4().hex,
                "key": key,
                "created_at": self._last_created,
                "ready": ready,
            }
            try:
                await agents.insert_one(doc)
                return doc
            except DuplicateKeyError:
                continue
        raise StoreError(f"MongoDB store: could not create agent {key!r}")
