"""The runtime: maps each (platform, user) to one persistent agent and runs
its events one at a time, in arrival order; different agents run concurrently.

This is the API adapters call: `await runtime.handle(event) -> list[Reply]`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.agent import Agent, EventResult
from bot.checkins.commands import checkin_command
from bot.checkins.functions import register_checkin_functions
from bot.checkins.rules import CheckinSettings
from bot.config import Settings
from bot.durable.debounce import split_batch
from bot.durable.inbox import Inbox
from bot.durable.lanes import Lanes
from bot.durable.leases import Leases, leases_for
from bot.durable.outbox import Outbox
from bot.durable.store_wait import StoreWait
from bot.events import Event, FileUploaded, Reply, UserMessage
from bot.forgetting.commands import LedgerCommands
from bot.functions.core import build_core_functions
from bot.functions.forget import register_forget_functions
from bot.limits import UsageLimits
from bot.llm import LLMClient
from bot.prompts import SYSTEM_INSTRUCTIONS
from bot.reports import describe_user, plural
from bot.sanitize import sanitize_event
from bot.services import AgentServices
from memory.archival import ArchivalMemory
from memory.backends import open_store, sqlite_url
from memory.embeddings import Embedder
from memory.ingest.loader import load_document
from memory.places import DM, DM_KEY
from memory.recall import RecallMemory
from memory.store import Store, StoreError
from memory.tokens import TokenCounter, load_encoder
from memory.types import Block, Message, utc_now
from memory.working_context import MemoryEditError, default_blocks, share_line

if TYPE_CHECKING:
    from bot.checkins.scheduler import CheckinScheduler

log = logging.getLogger(__name__)


def default_store(settings: Settings) -> Store:
    """MongoDB when MONGODB_URI is set, else the embedded SQLite file (memory/backends.py)."""
    if settings.mongodb_uri:
        return open_store(settings.mongodb_uri, database=settings.mongodb_db)
    return open_store(sqlite_url(Path(settings.data_dir) / "memgpt.sqlite3"))


class Runtime(LedgerCommands):
    def __init__(
        self,
        settings: Settings,
        store: Store,
        llm: LLMClient,
        embedder: Embedder,
        counter: TokenCounter | None = None,
        checkin_settings: CheckinSettings | None = None,
        leases: Leases | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.embedder = embedder
        self.archival = ArchivalMemory(store, embedder)
        # Recall is embedded lazily, by the same embedder, when an agent searches it.
        self.recall = RecallMemory(store, self.archival.embedder)
        counter = counter or TokenCounter(load_encoder(settings.model, settings.fallback_encoding))
        self.services = AgentServices(
            store=store,
            archival=self.archival,
            recall=self.recall,
            llm=llm,
            counter=counter,
            functions=build_core_functions(),
            instructions=SYSTEM_INSTRUCTIONS,
            context_window=settings.context_window,
            warning_threshold=settings.warning_threshold,
            flush_threshold=settings.flush_threshold,
            evict_fraction=settings.evict_fraction,
            response_reserve=settings.response_reserve,
            max_steps=settings.max_steps_per_event,
            search_page_size=settings.search_page_size,
            max_message_tokens=settings.max_message_tokens,
            queue_tokens=settings.queue_tokens,
            cached_token_weight=settings.cached_token_weight,
            summary_model=settings.summary_model,
            channel_context_tokens=settings.channel_context_tokens,
            plain_text_replies=settings.plain_text_replies,
            message_time_budget=settings.message_time_budget,
        )
        self._agents: dict[str, Agent] = {}
        # id(batch) -> the followers split off it by _handle_once, to handle alone after it.
        self._detached: dict[int, list[Event]] = {}
        # One event (or admin call) per agent at a time in this process, in arrival order.
        self._lanes = Lanes()
        # Several bot processes on one database: one of them works on an agent
        # at a time (bot/durable/leases.py); a no-op for a single process.
        self.leases = leases or leases_for(store, settings.leases)
        # Check-ins: the schedules live beside the memory, in the same store.
        self.checkin_settings = checkin_settings or settings.checkins
        self.schedules = store.schedules
        # Registered before any agent loads: each agent counts the schemas once.
        register_forget_functions(self.services.functions)  # selective forget in chat (bot/functions/forget.py)
        register_checkin_functions(
            self.services.functions, self.schedules, self.checkin_settings, utc_now, on_change=self._schedules_changed
        )
        self.scheduler: CheckinScheduler | None = None  # set by `memgpt-bot run` (cli/app.py)
        # Inbound events and outgoing replies survive a crash (bot/durable/).
        self.inbox = Inbox(store, leases=self.leases)
        self.outbox = Outbox(store, leases=self.leases)
        # The port's crash-safety calls go straight to the pipeline (bot/ports.py).
        self.receive = self.inbox.receive
        self.finished = self.inbox.finished
        self.leftovers = self.inbox.leftovers
        self.report_delivery = self.outbox.report
        self.file_notice = self.outbox.file_notice
        # Per-user message rate and daily token budget, counted in the store (bot/limits.py).
        self.limits = UsageLimits(store, settings)
        # Store faults (SQLite busy or full, MongoDB down): events wait, then are left
        # waiting in the journal (bot/durable/store_wait.py).
        self.store_wait = StoreWait(self.inbox, settings.store_wait)
        # MEMGPT_DEBOUNCE_SECONDS, for the adapters' debouncers (bot/durable/debounce.py).
        self.debounce_seconds = settings.debounce_seconds

    @classmethod
    async def create(
        cls,
        settings: Settings,
        *,
        store: Store | None = None,
        llm: LLMClient | None = None,
        embedder: Embedder | None = None,
    ) -> Runtime:
        store = store or default_store(settings)
        await store.open()
        llm = llm or LLMClient(
            settings.model,
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url,
            timeout=settings.llm_timeout,
            max_retries=settings.llm_max_retries,
            concurrency=settings.llm_concurrency,
        )
        return cls(settings, store, llm, embedder or Embedder(settings.embedding_model))

    @property
    def agents_in_memory(self) -> int:
        """Agents loaded in this process (a gauge in bot/metrics.py)."""
        return len(self._agents)

    # -- the adapters' API -------------------------------------------------
    async def handle(self, event: Event) -> list[Reply]:
        return (await self.handle_with_details(event)).replies

    async def handle_with_details(self, event: Event) -> EventResult:
        for member in event.members():  # debounced followers too (bot/durable/debounce.py)
            sanitize_event(member)  # before anything stores or renders it (bot/sanitize.py)
        key = event.agent_key
        # A store fault redoes the whole event with backoff for up to
        # MEMGPT_STORE_WAIT, holding the user's line; then the person is told
        # and the event is left pending in the journal (bot/durable/store_wait.py).
        result = await self.store_wait.run(event, lambda: self._handle_once(event))
        # Followers a batch could not take (bot/durable/debounce.py): each handled alone.
        for alone in self._detached.pop(id(event), []):
            result.replies += (await self.store_wait.run(alone, functools.partial(self._handle_once, alone))).replies
        if self.scheduler is not None and not result.unfinished and isinstance(event, UserMessage | FileUploaded):
            # The person answered: check-in back-off starts over.
            try:
                await self.scheduler.user_active(key, event.created_at)
            except StoreError as error:
                # The replies must still go out (they are in the outbox, unsent); the back-off catches up later.
                log.warning("could not note %s as active for check-ins (%s)", key, error)
        return result

    async def _handle_once(self, event: Event) -> EventResult:
        key = event.agent_key
        # The agent's line (then the lock) is joined before any await, so events
        # keep their arrival order; if another process worked on the agent since
        # our last turn, the cached copy is stale and the agent is reloaded.
        async with (
            self.leases.hold(key) as turn,
            self._lanes.hold(key),
            self.inbox.quarantine.admit(event.journal_id),
        ):
            try:
                agent = await self._agent(key, reload=not turn.continuous)
                detached = await split_batch(self.store, agent.id, event)
                if detached:
                    self._detached[id(event)] = detached
                # From here on, a crash may count against the event. The journal write needs
                # no answer before the reads below: it shares their round trip to the store.
                running = asyncio.ensure_future(self.inbox.started(event))
                try:
                    # Debounce: its leader answers it (a replayed follower only).
                    answered = await self.inbox.answered_with_its_batch(agent.id, event)
                    # Over a limit: kept in recall, no LLM call, perhaps a notice (bot/limits.py).
                    held = None if answered else await self.limits.admit(agent, event)
                finally:
                    await running
                if answered:
                    return EventResult()
                notice: list[Reply] = []
                if isinstance(event, FileUploaded) and held is None:
                    event.passages_saved = await self._save_upload(agent, event)
                    notice = await self._upload_notices(event)
                result = held if held is not None else await self.limits.metered(agent, event)
                result.replies = notice + result.replies
                await self.inbox.ran(event)
            except StoreError:
                # A failed write can leave the cached agent ahead of the store
                # (its queue, counts, blocks): a redo starts from what was stored.
                self._agents.pop(key, None)
                raise
        return result

    # -- agents ------------------------------------------------------------
    async def _agent(self, key: str, *, reload: bool = False) -> Agent:
        if reload:
            self._agents.pop(key, None)
        agent = self._agents.get(key)
        if agent is None:
            limits = self.settings
            blocks = default_blocks(limits.persona_limit, limits.human_limit, private_limit=limits.private_limit)
            agent = self._agents[key] = await Agent.load(key, blocks, self.services)
        return agent

    async def agent(self, key: str) -> Agent:
        async with self._lanes.hold(key):
            return await self._agent(key)

    async def _upload_notices(self, event: FileUploaded) -> list[Reply]:
        """The "Saved X" notice; for a durable event, through the outbox like
        the agent's replies (under its own id, so it never counts as the
        agent's answer), and not sent again when the event is redone."""
        reply = self._upload_notice(event)
        if not event.durable:
            return [reply]
        return await self.outbox.file_notice(reply)

    @staticmethod
    def _upload_notice(event: FileUploaded) -> Reply:
        if event.load_error:
            text = f"I couldn't read {event.filename}: {event.load_error}"
        else:
            text = f"Saved {event.filename} to my memory ({plural(event.passages_saved, 'passage')})."
        return event.reply(text)

    async def _save_upload(self, agent: Agent, event: FileUploaded) -> int:
        # The same extraction, chunking and de-duplication as `memgpt-bot load`;
        # vectors are written with the passages, so the agent can search them at once.
        result = await load_document(
            self.archival,
            agent.id,
            event.filename,
            event.data,
            event.content_type,
            text=event.text or None,
            counter=self.services.counter,
            place=event.place.key,  # an upload in a DM stays DM-only (memory/places.py)
        )
        if result.status == "failed":
            event.load_error = result.reason
            return 0
        agent.counted(event.place.key, passages=result.passages_added)
        return result.passages

    # -- admin and data rights ---------------------------------------------
    async def forget(self, key: str) -> bool:
        """Delete everything held on this user. Returns whether there was anything."""
        async with self.leases.hold(key), self._lanes.hold(key):
            # Check-ins can exist for someone who never chatted: delete them first.
            removed = await self.schedules.delete_for_agent_key(key)
            if removed:
                await self._schedules_changed()
            await self.store.journal_forget(key)
            await self.limits.forget(key)
            record = await self.store.find_agent(key)
            self._agents.pop(key, None)
            if record is not None:
                self.archival.forget(record.id)
                self.recall.forget(record.id)
                await self.store.delete_agent(record.id)
            # Nothing of theirs may stay readable in the store's files (the SQLite WAL).
            await self.store.flush_deleted()
            return record is not None or removed > 0

    async def share_line(self, key: str, label: str, line_id: str) -> Block:
        """Show one working-context line of this user's everywhere (their choice, from /memory).
        MemoryEditError (a message for them) if there is no such line or it cannot be shared."""
        async with self.leases.hold(key), self._lanes.hold(key):
            record = await self.store.find_agent(key)
            if record is None:
                raise MemoryEditError("I hold nothing on you yet.")
            block = await share_line(self.store, record.id, label, line_id)
            self._agents.pop(key, None)  # a loaded agent reloads its blocks as stored
            return block

    # -- /checkin, for the slash commands (bot/commands/) -----------------------
    async def checkin_command(self, platform: str, user_id: str, text: str, reply_to: dict[str, Any]) -> str:
        """`/checkin ...` on any platform: manage this user's scheduled check-ins."""
        return await checkin_command(
            platform,
            user_id,
            text,
            reply_to,
            self.schedules,
            utc_now,
            settings=self.checkin_settings,
            on_change=self._schedules_changed,
        )

    async def _schedules_changed(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.resync()

    async def describe(self, key: str) -> dict[str, Any] | None:
        """Working context, summary and counts (for `/memory` and `memory show`)."""
        async with self._lanes.hold(key):
            return await describe_user(self.store, key)

    async def export(self, key: str) -> dict[str, Any] | None:
        async with self._lanes.hold(key):
            record = await self.store.find_agent(key)
            if record is None:
                return None
            await self.archival.settle(record.id)
            blocks = await self.store.load_blocks(record.id)
            conversations = await self.store.list_conversations(record.id)
            messages = await self.store.messages_since(record.id, 0)
            count = await self.store.count_passages(record.id)
            passages = await self.store.list_passages(record.id, count, 0) if count else []
        return {
            "user": key,
            "agent_id": record.id,
            "created_at": record.created_at.isoformat(),
            # Each line with where and when it was written: a restore keeps who may read it.
            "working_context": {
                b.label: {"value": b.value, "limit": b.limit, "lines": [line.record() for line in b.lines]}
                for b in blocks
            },
            "summary": next((c.summary for c in conversations if c.place == DM_KEY), ""),
            "conversations": [
                {"place": c.place, "name": c.name, "summary": c.summary, "queue_start_seq": c.queue_start_seq}
                for c in conversations
            ],
            "messages": [
                {
                    "seq": m.seq,
                    "role": m.role,
                    "content": m.content,
                    "tool_calls": m.tool_calls,
                    "tool_call_id": m.tool_call_id,
                    "created_at": m.created_at.isoformat(),
                    "place": m.place,
                }
                for m in messages
            ],
            "passages": [
                {
                    "id": p.id,
                    "text": p.text,
                    "source": p.source,
                    "position": p.position,
                    "created_at": p.created_at.isoformat(),
                    "place": p.place,
                }
                for p in passages
            ],
        }

    async def import_history(self, key: str, messages: Iterable[Message]) -> int:
        """Load past conversation into recall storage (not into the queue), as
        the DM conversation's: private to the person, like anything of unknown place."""
        batch = list(messages)
        async with self.leases.hold(key) as turn, self._lanes.hold(key):
            agent = await self._agent(key, reload=not turn.continuous)
            for message in batch:
                message.place = DM.key
            await self.store.append_messages(agent.id, batch)
            agent.counted(DM.key, messages=len(batch))
            # Imported history is older than anything live: it belongs in recall
            # storage, not in the DM queue, so that queue restarts after it.
            if batch:
                dm = await agent.conversation_for(DM)
                start = batch[-1].seq + 1
                await self.store.update_queue(agent.id, dm.record.summary, start, utc_now(), place=DM.key)
                dm.record.queue_start_seq = start
                dm.queue.load(dm.record.summary, [], agent.working_context.render(DM))
            return len(batch)

    async def close(self, *, close_embedder: bool = True) -> None:
        await self.archival.settle_all()
        await self.recall.close()
        await self.llm.close()
        if close_embedder:
            await self.embedder.close()
        await self.leases.close()
        await self.store.close()
