"""The runtime: the place that builds the bot (the store's roles, the agents'
services, the inbox and outbox, the limits, the functions) and holds the
registry of doors, one per agent (bot/door.py), through which every kind of
work on an agent enters: events one at a time per agent, in arrival order,
different agents concurrently. It serves the event port and the commands
(bot/ports.py), and the CLI's admin calls, each through its agent's door.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.agent import Agent, EventResult
from bot.channels.listening import ChannelListener
from bot.checkins.commands import checkin_command
from bot.checkins.functions import register_checkin_functions
from bot.config import Settings
from bot.door import Doors, StoreWait
from bot.durable.inbox import Inbox
from bot.durable.leases import Leases, NoLeases, leases_for
from bot.durable.outbox import Outbox
from bot.durable.redelivery import Sender
from bot.events import Event
from bot.forgetting.commands import LedgerCommands
from bot.forgetting.retention import ChannelRetention
from bot.functions.core import build_core_functions
from bot.functions.forget import register_forget_functions
from bot.limits import UsageLimits
from bot.llm import LLMClient
from bot.prompts import SYSTEM_INSTRUCTIONS
from bot.reports import describe_user
from bot.services import AgentServices
from bot.settings import CheckinSettings
from memory.archival import ArchivalMemory
from memory.backends import open_store, sqlite_url
from memory.channel_notes import ChannelNotes
from memory.channels import ChannelMemory
from memory.embeddings import Embedder
from memory.places import DM, DM_KEY
from memory.recall import RecallMemory
from memory.store import Store
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
        # What channels keep of what their members say (docs/channel_memory.md): searched from
        # a channel, with its notes.
        self.channel_memory = ChannelMemory(store, self.recall)
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
            channels=self.channel_memory,
            channel_notes=ChannelNotes(self.channel_memory, settings.channel_notes_limit),
        )
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
        # How long channels keep what their members say (bot/forgetting/retention.py).
        self.retention = ChannelRetention(self.channel_memory, settings.channel_retention_days)
        # Inbound events and outgoing replies survive a crash (bot/durable/).
        self.inbox = Inbox(store, leases=self.leases)
        self.outbox = Outbox(store, leases=self.leases)
        # Per-user message rate and daily token budget, counted in the store (bot/limits.py).
        self.limits = UsageLimits(store, settings, remember=not isinstance(self.leases, NoLeases))
        # Store faults (SQLite busy or full, MongoDB down): events wait, then are left
        # waiting in the inbox (bot/door.py: StoreWait).
        self.store_wait = StoreWait(self.inbox, settings.store_wait)
        # One door per agent: every kind of work on an agent enters through it (bot/door.py).
        self.doors = doors = Doors(
            self.services,
            lambda: default_blocks(settings.persona_limit, settings.human_limit, private_limit=settings.private_limit),
            leases=self.leases,
            inbox=self.inbox,
            outbox=self.outbox,
            store_wait=self.store_wait,
            limits=self.limits,
        )
        self.services.forget_in_channels = self.forget_in_channels_after  # the chat's forget_memories
        # The event port (bot/ports.py): the doors', the inbox's replays and the outbox's reports.
        self.handle, self.turn, self.deliver, self.settle = doors.handle, doors.turn, doors.deliver, doors.settle
        self.receive, self.finished, self.leftovers = doors.receive, doors.finished, self.inbox.leftovers
        self.report_delivery, self.file_notice = self.outbox.report, self.outbox.file_notice
        # What channels say, kept for each channel (memory/channels.py), and the channel port
        # (bot/channels/): modes, and lines heard in listening channels. No agent, no LLM.
        self.channel_memory = ChannelMemory(store, self.recall)
        self.channels = ChannelListener(self.channel_memory)
        self.channel_mode, self.set_channel_mode = self.channels.channel_mode, self.channels.set_mode
        self.hear, self.heard_edit, self.heard_delete = (
            self.channels.hear,
            self.channels.heard_edit,
            self.channels.heard_delete,
        )
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
        return self.doors.agents_in_memory

    # -- events (each through its agent's door, bot/door.py) ------------------------
    async def handle_with_details(self, event: Event) -> EventResult:
        return await self.doors.door(event.agent_key).handle(event)

    async def agent(self, key: str) -> Agent:
        """The agent, loaded in its turn (for the CLI's document commands)."""
        return await self.doors.admin(key, lambda: self.doors.agent(key), changes=False)

    # -- admin and data rights ---------------------------------------------
    async def forget(self, key: str) -> bool:
        """Delete everything held on this user. Returns whether there was anything."""
        # Their events received until now go with them (an unfinished one is not
        # answered after a crash); one that comes while this waits for its turn stays.
        asked = utc_now()

        async def forgetting() -> bool:
            # Check-ins can exist for someone who never chatted: delete them first.
            removed = await self.schedules.delete_for_agent_key(key)
            if removed:
                await self._schedules_changed()
            await self.store.inbox_scrub(key, forgotten_at=asked)
            await self.limits.forget(key)
            record = await self.store.find_agent(key)
            if record is not None:
                self.archival.forget(record.id)
                self.recall.forget(record.id)
                await self.store.delete_agent(record.id)
            # Nothing of theirs may stay readable in the store's files (the SQLite WAL).
            await self.store.flush_deleted()
            return record is not None or removed > 0

        held = await self.doors.admin(key, forgetting)
        # What channels kept of them, and its copies in other people's memories
        # (bot/forgetting/channels.py). An "off" choice outlives the forget: forgetting
        # them must not start keeping what they say again; an "on" is the default, and goes.
        erased = await self.erase_in_channels(key)
        if (await self.channel_memory.consent([key])).get(key):
            await self.channel_memory.set_consent(key, None)
            await self.store.flush_deleted()
        return held or erased.lines > 0 or erased.notes > 0

    async def share_line(self, key: str, label: str, line_id: str) -> Block:
        """Show one working-context line of this user's everywhere (their choice, from /memory).
        MemoryEditError (a message for them) if there is no such line or it cannot be shared."""

        async def sharing() -> Block:
            record = await self.store.find_agent(key)
            if record is None:
                raise MemoryEditError("I hold nothing on you yet.")
            return await share_line(self.store, record.id, label, line_id)

        return await self.doors.admin(key, sharing)  # a loaded agent reloads its blocks as stored

    # -- /checkin, for the slash commands (bot/commands/) -----------------------
    async def checkin_command(self, platform: str, user_id: str, text: str, reply_to: dict[str, Any]) -> str:
        """`/checkin ...` on any platform: manage this user's scheduled check-ins (no agent's
        turn: it reads and writes only the schedules; counted in flight for the shutdown wait)."""
        with self.doors.counted():
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

    def connect(self, deliver: Sender | None, scheduler: CheckinScheduler | None) -> None:
        """What `memgpt-bot run` (cli/app.py) wires once its adapters are up: `deliver` sends
        replies that answer no event (the storage-trouble notice), `scheduler` fires check-ins
        and hears when a person wrote. None, None: disconnected, at shutdown."""
        self.store_wait.notify = deliver
        self.scheduler = scheduler
        if deliver is None and scheduler is None:
            self.retention.cancel()
        else:
            self.retention.start()  # MEMGPT_CHANNEL_RETENTION_DAYS (bot/forgetting/retention.py)
        self.doors.on_active = scheduler.user_active if scheduler is not None else None

    async def _schedules_changed(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.resync()

    async def describe(self, key: str) -> dict[str, Any] | None:
        """Working context, summary and counts (for `/memory` and `memory show`)."""
        return await self.doors.admin(key, lambda: describe_user(self.store, key), changes=False)

    async def export(self, key: str) -> dict[str, Any] | None:
        return await self.doors.admin(key, lambda: self._export(key), changes=False)

    async def _export(self, key: str) -> dict[str, Any] | None:
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

        async def importing() -> int:
            agent = await self.doors.agent(key, reload=True)  # as stored: another process may have changed it
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

        return await self.doors.admin(key, importing)

    async def close(self, *, close_embedder: bool = True) -> None:
        await self.retention.stop()
        await self.archival.settle_all()
        await self.recall.close()
        await self.llm.close()
        if close_embedder:
            await self.embedder.close()
        await self.leases.close()
        await self.store.close()
