"""MongoStore's side of channel memories: the ChannelStore role
(memory/roles.py). A channel's lines are documents of `messages` (of the
channel's pseudo-agent) with a `speaker` and `speaker_name` (and `edited_at`
once edited); content and folded terms live in the one document, its
embedding in message_vectors (memory/mongo/vectors.py), deleted with it, so
no copy is left, and the in-process ranking index of each channel touched is
read again from what is left.

    channel_consent  {_id: speaker agent key, keep, set_at}
    channel_modes    {_id: channel key, mode, set_at, armed: times "mention" re-armed the notice}
    channel_notices  {_id: channel key + " " + armed, at}: the notice said (claimed by inserting it)

Writes go by `_id` (memory/mongo/base.py: update_by_id says why).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Sequence
from datetime import datetime

from pymongo import ASCENDING, IndexModel
from pymongo.errors import DuplicateKeyError

from memory.mongo.base import Doc, from_us, to_us
from memory.mongo.capabilities import guarded
from memory.mongo.forgetting import MongoForgetting
from memory.mongo.keywords import words
from memory.mongo.vectors import VECTORS, drop_vectors
from memory.types import Message, prefix_end

CHANNEL_INDEXES: dict[str, list[IndexModel]] = {
    # A speaker's lines across channels (people's own messages have no speaker).
    "messages": [
        IndexModel(
            [("speaker", ASCENDING), ("agent_id", ASCENDING), ("seq", ASCENDING)], sparse=True, name="speaker_agent"
        )
    ],
}


class MongoChannels(MongoForgetting):
    # Messages as MongoStore reads them: its projection (no search-only fields) and its record.
    _message_fields: Doc

    @staticmethod
    @abstractmethod
    def _message_of(doc: Doc) -> Message: ...

    @guarded
    async def edit_message(self, agent_id: str, event_id: str, content: str, edited_at: datetime) -> bool:
        messages = self._c("messages")
        doc = await messages.find_one({"agent_id": agent_id, "event_id": event_id}, self._message_fields)
        if doc is None:
            return False
        message = self._message_of(doc)
        message.content = content
        terms = sorted(set(words(message.searchable_text())))
        fields = {"content": content, "edited_at": to_us(edited_at), "terms": terms}
        await messages.update_one({"_id": doc["_id"]}, {"$set": fields, "$unset": {"embedded": ""}})
        await drop_vectors(self._c(VECTORS), agent_id, [message.seq])
        self._conversations.forget(agent_id)
        return True

    @guarded
    async def delete_event_messages(self, agent_id: str, event_ids: Sequence[str]) -> int:
        if not event_ids:
            return 0
        return await self._delete_where({"agent_id": agent_id, "event_id": {"$in": sorted(set(event_ids))}})

    @guarded
    async def speaker_messages(self, speaker: str, *, agent_id: str | None = None) -> list[tuple[str, Message]]:
        cursor = self._c("messages").find(_speaker_where(speaker, agent_id), self._message_fields)
        docs = [doc async for doc in cursor.sort([("agent_id", ASCENDING), ("seq", ASCENDING)])]
        keys = await self._agent_keys({doc["agent_id"] for doc in docs})
        found = [(keys[doc["agent_id"]], self._message_of(doc)) for doc in docs if doc["agent_id"] in keys]
        return sorted(found, key=lambda pair: (pair[0], pair[1].seq))

    @guarded
    async def speaker_message_counts(self, speaker: str) -> dict[str, int]:
        pipeline: list[Doc] = [{"$match": {"speaker": speaker}}, {"$group": {"_id": "$agent_id", "n": {"$sum": 1}}}]
        counts = {row["_id"]: int(row["n"]) async for row in await self._c("messages").aggregate(pipeline)}
        keys = await self._agent_keys(set(counts))
        return {keys[agent_id]: count for agent_id, count in sorted(counts.items()) if agent_id in keys}

    @guarded
    async def delete_speaker_messages(self, speaker: str, *, agent_id: str | None = None) -> int:
        return await self._delete_where(_speaker_where(speaker, agent_id))

    @guarded
    async def prune_messages(self, key_prefix: str, before: datetime) -> int:
        agents = self._c("agents").find({"key": {"$gte": key_prefix, "$lt": prefix_end(key_prefix)}}, {"_id": 1})
        ids = [doc["_id"] async for doc in agents]
        if not ids:
            return 0
        return await self._delete_where({"agent_id": {"$in": ids}, "created_at": {"$lt": to_us(before)}})

    async def _delete_where(self, where: Doc) -> int:
        """Delete the messages matching `where`, whole, and drop the ranking
        index of each agent that lost some."""
        messages = self._c("messages")
        found = [doc async for doc in messages.find(where, {"_id": 1, "agent_id": 1, "seq": 1})]
        if not found:
            return 0
        agents = {doc["agent_id"] for doc in found}
        for agent_id in agents:  # vectors first: a crash between leaves no vector of a deleted line
            await drop_vectors(self._c(VECTORS), agent_id, [doc["seq"] for doc in found if doc["agent_id"] == agent_id])
        result = await messages.delete_many({"_id": {"$in": [doc["_id"] for doc in found]}})
        for agent_id in agents:
            self._conversations.forget(agent_id)
        return int(result.deleted_count)

    async def _agent_keys(self, agent_ids: Collection[str]) -> dict[str, str]:
        if not agent_ids:
            return {}
        cursor = self._c("agents").find({"_id": {"$in": sorted(agent_ids)}}, {"key": 1})
        return {doc["_id"]: doc["key"] async for doc in cursor}

    @guarded
    async def set_channel_consent(self, speaker: str, keep: bool | None, at: datetime) -> None:
        consent = self._c("channel_consent")
        if keep is None:
            await consent.delete_one({"_id": speaker})
            return
        fields = {"keep": keep, "set_at": to_us(at)}
        try:
            await consent.update_one({"_id": speaker}, {"$set": fields}, upsert=True)
        except DuplicateKeyError:  # a concurrent first choice inserted it: one plain update is enough
            await consent.update_one({"_id": speaker}, {"$set": fields})

    @guarded
    async def channel_consent(self, speakers: Collection[str]) -> dict[str, bool]:
        if not speakers:
            return {}
        cursor = self._c("channel_consent").find({"_id": {"$in": sorted(set(speakers))}})
        return {doc["_id"]: bool(doc["keep"]) async for doc in cursor}

    @guarded
    async def list_channel_consent(self) -> list[tuple[str, bool, datetime]]:
        cursor = self._c("channel_consent").find({}).sort("_id", 1)
        return [(doc["_id"], bool(doc["keep"]), from_us(doc["set_at"])) async for doc in cursor]

    @guarded
    async def set_channel_mode(self, channel: str, mode: str, at: datetime) -> None:
        change: Doc = {"$set": {"mode": mode, "set_at": to_us(at)}}
        if mode == "mention":  # re-armed: the next time it listens, the bot says so again
            change["$inc"] = {"armed": 1}
        modes = self._c("channel_modes")
        try:
            await modes.update_one({"_id": channel}, change, upsert=True)
        except DuplicateKeyError:  # a concurrent first write inserted it: one plain update is enough
            await modes.update_one({"_id": channel}, change)

    @guarded
    async def channel_mode(self, channel: str) -> str | None:
        doc = await self._c("channel_modes").find_one({"_id": channel}, {"mode": 1})
        mode = doc.get("mode") if doc is not None else None
        return str(mode) if mode is not None else None

    @guarded
    async def claim_channel_notice(self, channel: str, at: datetime) -> bool:
        # An insert keyed by the channel and how often it was re-armed: the unique _id
        # makes it a compare-and-set on any server. (A filtered update_one is not one
        # on FerretDB, which reads then writes: several processes could each win.)
        doc = await self._c("channel_modes").find_one({"_id": channel}, {"armed": 1})
        armed = int(doc.get("armed") or 0) if doc is not None else 0
        try:
            await self._c("channel_notices").insert_one({"_id": f"{channel} {armed}", "at": to_us(at)})
        except DuplicateKeyError:
            return False
        return True


def _speaker_where(speaker: str, agent_id: str | None) -> Doc:
    return {"speaker": speaker} if agent_id is None else {"speaker": speaker, "agent_id": agent_id}
