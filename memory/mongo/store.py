"""The MongoDB storage backend, for production and for several bot processes
sharing one database, through PyMongo's native asyncio client.

MongoBase (base.py: values, state, errors, transactions), one mixin per role
on it (archival.py with sources.py on it, conversations.py, coordination.py,
inbox.py, usage.py) and MongoStore here (life cycle, agents, working
context, recall storage); indexes.py creates the indexes of all of them. Collections (every document but the counters
carries `agent_id`, and every query filters on it):

    agents    {_id: agent id, key, created_at, ready, [deleting]}
    conversations {agent_id, place, name, summary, queue_start_seq,
               summary_updated_at} (memory/mongo/conversations.py)
    blocks    {agent_id, label, lines, limit, updated_at, position}
               (memory/mongo/blocks.py)
    messages  {agent_id, seq, batch_end, tok_total, role, content, tool_calls,
               tool_call_id, name, created_at, place, terms, [embedded],
               [speaker, speaker_name, edited_at]: channels.py}
    passages  {_id: int id, agent_id, text, source, position, created_at,
               place, embedding, embedded, [hash], terms, words, analysed}
    message_vectors {_id: "<agent id>:<seq>", agent_id, seq, embedding}
               (memory/mongo/vectors.py: recall's embeddings, apart)
    counters  {_id: "passage_id" | "vectors:<agent id>", value}
    sources, source_attachments, documents (see memory/mongo/sources.py)
    lease_owners, lease_tickets (memory/mongo/coordination.py)
    event_journal, outbox (memory/mongo/inbox.py)
    schedules, schedule_claims, checkin_prefs (memory/mongo/schedules.py)
    usage_hits, usage_exempt (memory/mongo/usage.py)
    channel_consent (memory/mongo/channels.py)

Times are integers, microseconds since the Unix epoch (UTC): a BSON date keeps
only milliseconds, and the store gives back exactly the instant it was given.

Atomicity. The only write every MongoDB-compatible server makes atomic is one
insert against a unique index (FerretDB, for one, runs findAndModify and
update as read, then write: concurrent `$inc`s lose updates). So the message
insert is the single source of truth for `seq`: an append reads the agent's
newest message, and inserts its batch as seqs `batch_end + 1 ...`, every
document carrying the batch's last seq as `batch_end`; the unique
(agent_id, seq) index turns a race into a duplicate key on the batch's first
document, and the loser re-reads and retries. Batches start only right after
a `batch_end`, so two batches can never interleave. `count_messages` counts
documents. Where transactions run (replica set, mongos) the read and the
insert share one, so a batch is all or nothing; on a standalone server a crash
in the middle of insert_many keeps the batch's first messages and leaves the
rest of its seqs unused: a gap, which nothing relies on (seqs stay unique and
ordered, the queue is still a suffix). See docs/mongodb.md.

Search. Recall: the agent's messages and the embeddings recall search stores
lazily for them (memory/recall.py; in message_vectors) are ranked in memory by conversation search,
as the SQLite store ranks them (memory/mongo/recall.py, memory/search/
conversation.py), with or without a query vector. Each message also stores its
distinct folded words (`terms`, a multikey index) for queries made only of stop
words, ranked by BM25 in Python. `$text` is not used even where it exists: its
textScore has no inverse document frequency.
Archival: hybrid like the SQLite store, cosine plus a keyword bonus
(memory.search.hybrid) whose BM25 side comes from the passages' `terms` the same way
(memory/mongo/keywords.py). The cosine comes from `$vectorSearch` when a ready
Atlas vector index is named, otherwise from an in-process VectorIndex per
agent, built from the stored vectors and kept in step (across processes too)
by a per-agent version counter.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Sequence
from datetime import UTC, datetime

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

from memory.mongo.base import LIVE, MAX_ATTEMPTS, Doc, LostRace, Session, from_us, lost_race, to_us, visible_filter
from memory.mongo.blocks import block_fields, block_from_doc, upgrade_block_lines
from memory.mongo.capabilities import detect, guarded, scrub
from memory.mongo.channels import MongoChannels
from memory.mongo.conversations import MongoConversations, upgrade_to_places
from memory.mongo.coordination import MongoCoordination
from memory.mongo.inbox import MongoInbox
from memory.mongo.indexes import ensure_indexes
from memory.mongo.keywords import bm25, upgrade_passage_terms, words
from memory.mongo.schedules import MongoScheduleStore
from memory.mongo.sources import MongoSources
from memory.mongo.usage import MongoUsage
from memory.mongo.vectors import VECTORS, upgrade_message_vectors
from memory.places import DM_KEY, Visibility
from memory.search.analysis import query_terms
from memory.store import OutboxEntry, Store, StoreError
from memory.types import AgentRecord, Block, Message, SearchPage

log = logging.getLogger(__name__)

_MAX_QUERY_TERMS = 32
# Search-only fields, never sent back with a message.
_NO_TERMS: Doc = {"terms": 0, "batch_end": 0, "tok_total": 0, "embedded": 0}


# -- values ------------------------------------------------------------------
def _agent(doc: Doc) -> AgentRecord:
    return AgentRecord(doc["_id"], doc["key"], from_us(doc["created_at"]))


def _message(doc: Doc) -> Message:
    return Message(
        seq=doc["seq"],
        role=doc["role"],
        content=doc.get("content"),
        tool_calls=json.loads(doc["tool_calls"]) if doc.get("tool_calls") else None,
        tool_call_id=doc.get("tool_call_id"),
        name=doc.get("name"),
        created_at=from_us(doc["created_at"]),
        event_id=doc.get("event_id"),
        place=doc.get("place", DM_KEY),
        speaker=doc.get("speaker"),
        speaker_name=doc.get("speaker_name", ""),
        edited_at=from_us(doc["edited_at"]) if "edited_at" in doc else None,
    )


def _last_batch(newest: Doc | None) -> tuple[int, int]:
    """(last seq handed out, words stored so far) from an agent's newest message."""
    if newest is None:
        return 0, 0
    end = newest["batch_end"] if "batch_end" in newest else newest["seq"]
    return int(end), int(newest.get("tok_total") or 0)


class MongoStore(MongoCoordination, MongoInbox, MongoSources, MongoConversations, MongoUsage, MongoChannels, Store):
    serves_many_processes = True  # the backend for several bot processes
    _message_fields = _NO_TERMS
    _message_of = staticmethod(_message)

    @functools.cached_property
    def schedules(self) -> MongoScheduleStore:
        """Check-in schedules, in this store's database."""
        return MongoScheduleStore(self)

    # -- life cycle --------------------------------------------------------
    async def open(self) -> None:
        if self._client is not None:
            return
        try:
            client: AsyncMongoClient[Doc] = AsyncMongoClient(
                self._uri, serverSelectionTimeoutMS=self._timeout_ms, appname="memgpt-bot"
            )
        except PyMongoError as exc:
            raise self.error("open", exc) from exc
        except (TypeError, ValueError) as exc:
            detail = scrub(str(exc), self._uri)
            raise StoreError(f"invalid MongoDB settings for {self.redacted_uri}: {detail}") from None
        try:
            db = client[self.database]
            await db.command("ping")
            await ensure_indexes(db)
            await upgrade_to_places(db)
            await upgrade_block_lines(db)
            await upgrade_passage_terms(db["passages"])
            await upgrade_message_vectors(db)
            await self._prepare_coordination(db)
            capabilities = await detect(db, self._vector_index)
            try:
                await db["counters"].update_one({"_id": "passage_id"}, {"$setOnInsert": {"value": 0}}, upsert=True)
            except DuplicateKeyError:
                pass  # another process's first open inserted it between our match and insert: it exists
            self._client, self._db, self.capabilities = client, db, capabilities
            # Finish deletions a crash interrupted (see delete_agent).
            async for doc in db["agents"].find({"deleting": True}, {"_id": 1}):
                log.info("finishing the interrupted deletion of agent %s", doc["_id"])
                await self._purge(doc["_id"])
        except BaseException as exc:
            self._client = self._db = None
            await client.close()
            if isinstance(exc, PyMongoError):
                raise self.error("open", exc) from exc
            raise
        log.info("MongoDB store %s, database %r: %s", self.redacted_uri, self.database, capabilities.describe())

    async def close(self) -> None:
        client, self._client, self._db = self._client, None, None
        self._indexes.clear()
        if client is not None:
            await client.close()

    # -- agents ------------------------------------------------------------
    @guarded
    async def get_or_create_agent(self, key: str, default_blocks: Sequence[Block]) -> tuple[AgentRecord, list[Block]]:
        doc = await self._agent_doc(key)
        if not doc.get("ready"):
            # The agent document comes first and is marked ready once its
            # default blocks exist, so a crash in between is finished by the
            # next call; block inserts are idempotent (unique agent + label).
            now = to_us(datetime.now(UTC))
            blocks = [
                {"agent_id": doc["_id"], "label": b.label, **block_fields(b), "updated_at": now, "position": n}
                for n, b in enumerate(default_blocks, 1)
            ]
            if blocks:
                try:
                    await self._c("blocks").insert_many(blocks, ordered=False)
                except BulkWriteError as exc:
                    if not lost_race(exc):
                        raise
            await self._c("agents").update_one({"_id": doc["_id"]}, {"$set": {"ready": True}})
        return _agent(doc), await self.load_blocks(doc["_id"])

    @guarded
    async def find_agent(self, key: str) -> AgentRecord | None:
        doc = await self._c("agents").find_one({"key": key, **LIVE})
        return None if doc is None else _agent(doc)

    @guarded
    async def list_agents(self) -> list[AgentRecord]:
        cursor = self._c("agents").find(LIVE).sort([("created_at", ASCENDING), ("_id", ASCENDING)])
        return [_agent(doc) async for doc in cursor]

    @guarded
    async def delete_agent(self, agent_id: str) -> None:
        # Without transactions (and a history can be too big for one anyway):
        # first a tombstone, one atomic write that hides the agent and frees its
        # key; then the agent's documents go; the agent document goes last. A
        # crash in between leaves a tombstone that the next open() finishes.
        await self._c("agents").update_one(
            {"_id": agent_id}, {"$set": {"deleting": True, "key": f"#deleted:{agent_id}"}}
        )
        await self._purge(agent_id)

    async def flush_deleted(self) -> None:
        return None  # a server-backed store has no files of its own to clean

    async def _purge(self, agent_id: str) -> None:
        for name in (VECTORS, "messages", "passages", "blocks", "conversations"):  # vectors first (see forgetting.py)
            await self._c(name).delete_many({"agent_id": agent_id})
        await self._c("counters").delete_one({"_id": f"vectors:{agent_id}"})
        await self._purge_sources(agent_id)
        await self._c("agents").delete_one({"_id": agent_id})
        self._indexes.pop(agent_id, None)
        self._newest.pop(agent_id, None)
        self._conversations.forget(agent_id)

    # -- working context ---------------------------------------------------
    @guarded
    async def load_blocks(self, agent_id: str) -> list[Block]:
        cursor = self._c("blocks").find({"agent_id": agent_id}).sort([("position", ASCENDING), ("_id", ASCENDING)])
        return [block_from_doc(doc) async for doc in cursor]

    @guarded
    async def save_block(self, agent_id: str, block: Block) -> None:
        await self._require_agent(agent_id)
        blocks = self._c("blocks")
        where = {"agent_id": agent_id, "label": block.label}
        fields = block_fields(block)
        # A new label goes last; an existing one keeps its place.
        last = await blocks.find_one({"agent_id": agent_id}, {"position": 1}, sort=[("position", DESCENDING)])
        position = (last["position"] if last else 0) + 1
        try:
            await blocks.update_one(where, {"$set": fields, "$setOnInsert": {"position": position}}, upsert=True)
        except DuplicateKeyError:  # a concurrent save inserted the label first
            await blocks.update_one(where, {"$set": fields})

    # -- recall storage ----------------------------------------------------
    @guarded
    async def append_messages(
        self,
        agent_id: str,
        messages: Sequence[Message],
        *,
        unless_event: str | None = None,
        replies: Sequence[OutboxEntry] = (),
        after: int | None = None,
    ) -> list[Message]:
        for entry in replies:  # no multi-document transaction: written first, as if before the call
            await self.outbox_add(entry)
        if not messages:
            return []
        texts = [words(m.searchable_text()) for m in messages]
        docs = [
            {
                "agent_id": agent_id,
                "role": m.role,
                "content": m.content,
                "tool_calls": m.tool_calls_json(),
                "tool_call_id": m.tool_call_id,
                "name": m.name,
                "created_at": to_us(m.created_at),
                "place": m.place,
                "terms": sorted(set(t)),
                **({"event_id": m.event_id} if m.event_id else {}),
                **({"speaker": m.speaker, "speaker_name": m.speaker_name} if m.speaker is not None else {}),
                **({"edited_at": to_us(m.edited_at)} if m.edited_at is not None else {}),
            }
            for m, t in zip(messages, texts, strict=True)
        ]
        tokens = sum(map(len, texts))
        lock = self._append_locks.setdefault(agent_id, asyncio.Lock())
        async with lock:
            for attempt in range(MAX_ATTEMPTS):
                try:
                    append = functools.partial(self._append_once, agent_id, docs, tokens, unless_event, after)
                    first = await self._atomic(append)
                    break
                except LostRace:
                    after = None  # read the newest, as anyone who lost a race
                    await self._backoff(attempt)
            else:
                raise StoreError(f"MongoDB store: gave up appending to agent {agent_id!r} after {MAX_ATTEMPTS} races")
        if first is None:
            return []  # the event's message was stored before
        # Only now, so a failed append leaves the objects untouched.
        for n, m in enumerate(messages):
            m.seq = first + n
        return list(messages)

    async def _append_once(
        self,
        agent_id: str,
        docs: list[Doc],
        tokens: int,
        unless_event: str | None,
        after: int | None,
        session: Session,
    ) -> int | None:
        """Insert the batch after the agent's last batch and return its first seq
        (None if a message of `unless_event` is stored); LostRace if another writer
        took those seqs first (nothing of ours is left behind then)."""
        messages = self._c("messages")
        # The newest message needs no read when the caller's word (`after`) and
        # this process's last sight of it agree (the words so far come from here).
        last = self._newest.get(agent_id) if unless_event is None else None
        if last is None or after is None or _last_batch(last)[0] != after:
            last, recorded = await self._newest_message(agent_id, unless_event, session)
            if recorded:
                return None
        if last is None:
            # Only then: a deletion purges messages first (under the lease and lane: nothing appends).
            await self._require_agent(agent_id, session)
        handed_out, words_so_far = _last_batch(last)
        start, end, total = handed_out + 1, handed_out + len(docs), words_so_far + tokens
        batch = [{**doc, "seq": start + n, "batch_end": end, "tok_total": total} for n, doc in enumerate(docs)]
        try:
            await messages.insert_many(batch, ordered=True, session=session)
        except BulkWriteError as exc:
            if not lost_race(exc):
                raise
            # Ordered: the first nInserted went in (none in a transaction, which
            # is aborted). By construction a race is lost on the first document;
            # if it ever is later, take ours back.
            done = exc.details.get("nInserted", 0)
            if done and session is None:
                await messages.delete_many({"_id": {"$in": [doc["_id"] for doc in batch[:done]]}})
            raise LostRace from exc
        except DuplicateKeyError as exc:
            raise LostRace from exc
        self._newest[agent_id] = {"seq": end, "batch_end": end, "tok_total": total}
        return start

    @guarded
    async def messages_since(self, agent_id: str, seq: int, *, place: str | None = None) -> list[Message]:
        where: Doc = {"agent_id": agent_id, "seq": {"$gte": seq}}
        if place is not None:
            where["place"] = place
        cursor = self._c("messages").find(where, _NO_TERMS)
        return [_message(doc) async for doc in cursor.sort("seq", ASCENDING)]

    @guarded
    async def count_messages(self, agent_id: str, *, visible: Visibility | None = None) -> int:
        # Documents, not the last seq: a crash may have left a gap (see above).
        return await self._c("messages").count_documents({"agent_id": agent_id, **visible_filter(visible)})

    @guarded
    async def search_messages(
        self,
        agent_id: str,
        query: str,
        limit: int,
        offset: int = 0,
        *,
        query_vector: Sequence[float] | None = None,
        visible: Visibility | None = None,
    ) -> SearchPage:
        if query_vector is not None or query_terms(query):  # keywords alone too: conversation search's ranking
            return await self._hybrid_messages(agent_id, query, query_vector, limit, max(offset, 0), visible)
        # A query of stop words only ("what was it?"): BM25 over their plain words.
        terms = list(dict.fromkeys(words(query)))[:_MAX_QUERY_TERMS]
        ranked, _ = await self._bm25_messages(agent_id, terms, visible)
        page = ranked[max(offset, 0) : max(offset, 0) + max(limit, 0)]
        return SearchPage(items=[m for _, m in page], total=len(ranked))

    async def _bm25_messages(
        self, agent_id: str, terms: list[str], visible: Visibility | None = None
    ) -> tuple[list[tuple[float, Message]], float]:
        """The agent's messages holding any of `terms` (those `visible` sees),
        ranked by BM25 (score, message; best first, ties by seq), and the sum
        of the terms' IDFs."""
        if not terms:
            return [], 0.0
        messages = self._c("messages")
        where = {"agent_id": agent_id, "terms": {"$in": terms}, **visible_filter(visible)}
        candidates = [doc async for doc in messages.find(where, _NO_TERMS)]
        if not candidates:
            return [], 0.0
        # Collection statistics from the newest batch: messages so far and
        # their words (a crash gap makes these a little high; harmless).
        n_docs, words_so_far = _last_batch((await self._newest_message(agent_id, None, None))[0])
        avg_len = words_so_far / n_docs if n_docs else 0.0
        found = [_message(doc) for doc in candidates]
        texts = [words(m.searchable_text()) for m in found]
        scores = bm25(texts, terms, n_docs, avg_len)
        hits = [(score, m) for score, m in zip(scores, found, strict=True) if score > 0]
        # The IDFs bm25() used, summed: the score of a message holding every term once.
        n = max(n_docs, len(found))
        idf_total = sum(
            math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            for df in (sum(1 for text in texts if term in text) for term in terms)
        )
        return sorted(hits, key=lambda hit: (-hit[0], hit[1].seq)), idf_total

    async def _hybrid_messages(
        self,
        agent_id: str,
        query: str,
        query_vector: Sequence[float] | None,
        limit: int,
        offset: int,
        visible: Visibility | None,
    ) -> SearchPage:
        """Conversation search ranking over the agent's messages (memory/mongo/recall.py)."""
        messages = self._c("messages")
        vectors = self._c(VECTORS)
        ranked = await self._conversations.rank(
            messages, vectors, agent_id, query, query_vector, limit, offset, visible
        )
        seqs = [seq for seq, _ in ranked.items]
        if not seqs:
            return SearchPage(items=[], total=ranked.total)
        found = messages.find({"agent_id": agent_id, "seq": {"$in": seqs}}, _NO_TERMS)
        by_seq = {doc["seq"]: _message(doc) async for doc in found}
        return SearchPage(items=[by_seq[seq] for seq in seqs if seq in by_seq], total=ranked.total)

    @guarded
    async def messages_between(
        self,
        agent_id: str,
        start: datetime,
        end: datetime,
        limit: int,
        offset: int = 0,
        *,
        visible: Visibility | None = None,
    ) -> SearchPage:
        where = {
            "agent_id": agent_id,
            "created_at": {"$gte": to_us(start), "$lt": to_us(end)},
            **visible_filter(visible),
        }
        messages = self._c("messages")
        total = await messages.count_documents(where)
        if limit <= 0 or offset >= total:
            return SearchPage(items=[], total=total)
        cursor = messages.find(where, _NO_TERMS).sort([("created_at", ASCENDING), ("seq", ASCENDING)])
        cursor = cursor.skip(max(offset, 0)).limit(limit)
        return SearchPage(items=[_message(doc) async for doc in cursor], total=total)
