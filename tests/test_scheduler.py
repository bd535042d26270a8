"""The check-in engine end to end: a real Runtime on real SQLite, the scripted
LLM server, and a fake clock driven by the test (nothing here sleeps)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.agent import EventResult
from bot.checkins.commands import checkin_command
from bot.checkins.functions import register_checkin_functions
from bot.checkins.scheduler import CheckinScheduler, TickOutcome
from bot.events import Event, Reply, UserMessage
from bot.runtime import Runtime
from bot.settings import CheckinSettings
from memory.schedules import Schedule, ScheduleStore
from memory.store import Store
from memory.types import utc_now
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call

DM = {"channel": "D0123"}


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Rig:
    runtime: Runtime
    schedules: ScheduleStore
    scheduler: CheckinScheduler
    clock: FakeClock
    delivered: list[Reply] = field(default_factory=list)

    async def command(self, text: str, user: str = "42", reply_to: dict[str, Any] | None = None) -> str:
        return await checkin_command(
            "discord", user, text, reply_to or DM, self.schedules, self.clock, settings=self.scheduler.settings
        )

    async def run(self, now: datetime) -> list[TickOutcome]:
        self.clock.now = now
        return await self.scheduler.run_due(now)

    async def only(self, user: str = "42") -> Schedule:
        (schedule,) = await self.schedules.list_for_user(f"discord:{user}")
        return schedule


RigFactory = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def make_rig(make_runtime: RuntimeFactory) -> RigFactory:
    async def factory(
        start: datetime, data_dir: Path | None = None, settings: CheckinSettings | None = None, **overrides: Any
    ) -> Rig:
        runtime = await make_runtime(data_dir, **overrides)
        schedules = runtime.store.schedules
        clock = FakeClock(start)
        settings = settings or CheckinSettings()
        # Before any agent loads: each agent's queue manager counts the schemas once.
        register_checkin_functions(runtime.services.functions, schedules, settings, clock)
        delivered: list[Reply] = []

        async def deliver(replies: list[Reply]) -> None:
            delivered.extend(replies)

        scheduler = CheckinScheduler(runtime, schedules, deliver, clock, settings)
        return Rig(runtime, schedules, scheduler, clock, delivered)

    return factory


def greet(request: dict[str, Any]) -> Any:
    """A model that answers every event with one message."""
    return reply_tool_calls(tool_call("send_message", {"message": "Good morning! How did the interview go?"}))


def ticks(llm_server: FakeLLMServer) -> list[str]:
    """The tick texts the model was woken with."""
    return [
        r["messages"][-1]["content"]
        for r in llm_server.requests
        if "[scheduled tick]" in (r["messages"][-1]["content"] or "")
    ]


NO_BACKOFF = CheckinSettings(backoff_after=0)


# -- when ticks fire -------------------------------------------------------------
async def test_daily_paris_checkin_fires_at_the_right_instant_across_dst(
    make_rig: RigFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(greet)
    rig = await make_rig(utc(2026, 3, 27, 12), settings=NO_BACKOFF)
    assert "Europe/Paris" in await rig.command("tz Europe/Paris")
    answer = await rig.command("daily 09:00")
    assert "daily at 09:00" in answer and "Sat 28 Mar 09:00 Europe/Paris" in answer
    fired: list[datetime] = []
    # 09:00 Paris: 08:00 UTC before 29 March, 07:00 UTC from then; 08:00 again from 25 October.
    for instant in (utc(2026, 3, 28, 8), utc(2026, 3, 29, 7), utc(2026, 3, 30, 7)):
        assert await rig.run(instant - timedelta(seconds=1)) == []
        (outcome,) = await rig.run(instant)
        assert outcome.fired
        fired.append(instant)
    schedule = await rig.only()
    # Jump to October: re-arm from there as a resumed schedule would.
    await rig.command("pause all")
    rig.clock.now = utc(2026, 10, 23, 12)
    await rig.command("resume all")
    for instant in (utc(2026, 10, 24, 7), utc(2026, 10, 25, 8), utc(2026, 10, 26, 8)):
        assert await rig.run(instant - timedelta(seconds=1)) == []
        (outcome,) = await rig.run(instant)
        assert outcome.fired and outcome.due_at == instant
    assert len(ticks(llm_server)) == 6
    assert "Their local time: Sun 25 Oct 09:00 Europe/Paris" in ticks(llm_server)[4]
    assert schedule.id == (await rig.only()).id
    assert len(rig.delivered) == 6


async def test_quiet_hours_pause_and_remove(make_rig: RigFactory, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(greet)
    rig = await make_rig(utc(2026, 6, 1, 12), settings=NO_BACKOFF)
    await rig.command("tz Europe/Paris")
    await rig.command("daily 07:00")
    await rig.command("quiet 22:00-08:00")
    # 07:00 Paris is in quiet hours: the tick comes at 08:00 Paris (06:00 UTC), not 05:00 UTC.
    assert await rig.run(utc(2026, 6, 2, 5)) == []
    (outcome,) = await rig.run(utc(2026, 6, 2, 6))
    assert outcome.next_fire_at == utc(2026, 6, 3, 6)
    await rig.command("quiet off")
    assert (await rig.only()).next_fire_at == utc(2026, 6, 3, 5)
    await rig.command("pause")
    assert await rig.run(utc(2026, 6, 3, 5)) == [] and await rig.run(utc(2026, 6, 4, 5)) == []
    rig.clock.now = utc(2026, 6, 4, 12)
    await rig.command("resume")
    assert (await rig.only()).next_fire_at == utc(2026, 6, 5, 5)  # nothing fires for the paused days
    schedule = await rig.only()
    assert "Removed" in await rig.command(f"remove {schedule.id}")
    assert await rig.run(utc(2026, 6, 5, 5)) == []
    assert len(ticks(llm_server)) == 1


async def test_weekly_and_every_n_hours(make_rig: RigFactory, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(greet)
    rig = await make_rig(utc(2026, 11, 25, 12), settings=NO_BACKOFF)
    await rig.command("tz America/New_York", user="1")
    await rig.command("weekly mon 18:30 plan the week", user="1")
    rig.clock.now = utc(2026, 11, 30, 9, 10)
    await rig.command("every 4h", user="2")
    outcomes = await rig.run(utc(2026, 11, 30, 13, 10))
    assert [(o.agent_key, o.next_fire_at) for o in outcomes] == [("discord:2", utc(2026, 11, 30, 17, 10))]
    outcomes = await rig.run(utc(2026, 11, 30, 23, 30))  # Monday 18:30 in New York; the 4-hourly is due too
    assert sorted((o.agent_key, o.due_at, o.next_fire_at) for o in outcomes) == [
        ("discord:1", utc(2026, 11, 30, 23, 30), utc(2026, 12, 7, 23, 30)),
        ("discord:2", utc(2026, 11, 30, 17, 10), utc(2026, 12, 1, 1, 10)),
    ]
    weekly = [text for text in ticks(llm_server) if "weekly" in text]
    assert len(weekly) == 1 and "plan the week" in weekly[0] and "Mon 30 Nov 18:30 America/New_York" in weekly[0]


# -- what a tick does ------------------------------------------------------------
async def test_a_message_on_the_tick_reaches_deliver_with_the_setup_channel(
    make_rig: RigFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(greet)
    rig = await make_rig(utc(2027, 1, 4, 7))
    await rig.command("daily 08:00", reply_to={"channel": "D777", "team": "T1"})
    (outcome,) = await rig.run(utc(2027, 1, 4, 8))
    assert [(r.platform, r.user_id, r.reply_to, r.text) for r in rig.delivered] == [
        ("discord", "42", {"channel": "D777", "team": "T1"}, "Good morning! How did the interview go?")
    ]
    assert outcome.replies == rig.delivered
    (tick,) = ticks(llm_server)
    assert "Check-in the person asked for (daily at 08:00)" in tick and "Their local time: Mon 4 Jan 08:00 UTC" in tick


async def test_a_silent_tick_sends_nothing_and_stays_in_recall(make_rig: RigFactory, llm_server: FakeLLMServer) -> None:
    # Silent: the model looks something up and yields without send_message.
    llm_server.set_handler(
        lambda request: reply_tool_calls(
            tool_call("conversation_search", {"query": "interview", "request_heartbeat": False})
        )
    )
    rig = await make_rig(utc(2027, 1, 4, 7))
    await rig.command("daily 08:00")
    (outcome,) = await rig.run(utc(2027, 1, 4, 8))
    assert outcome.fired and outcome.replies == [] and rig.delivered == []
    agent = await rig.runtime.agent("discord:42")
    found = await rig.runtime.store.search_messages(agent.id, "[scheduled tick]", 5)
    # The tick itself, once; the lookup's result may quote it too (recall search
    # by meaning returns the nearest messages even when no word matches).
    (tick,) = [message for message in found.items if message.role == "user"]
    assert "[scheduled tick] Check-in the person asked for" in (tick.content or "")


async def test_two_runtimes_on_one_database_run_each_tick_once(
    make_rig: RigFactory, llm_server: FakeLLMServer, tmp_path: Path
) -> None:
    llm_server.set_handler(greet)
    start = utc(2027, 2, 1, 7)
    first = await make_rig(start, data_dir=tmp_path / "shared")
    second = await make_rig(start, data_dir=tmp_path / "shared")
    assert first.runtime.store is not second.runtime.store  # two connections, as two processes
    for user in range(6):
        await first.command("daily 08:00", user=str(user))
    due = utc(2027, 2, 1, 8)
    outcomes = await asyncio.gather(first.run(due), second.run(due), first.run(due), second.run(due))
    assert sum(len(batch) for batch in outcomes) == 6
    assert len(ticks(llm_server)) == 6
    delivered = first.delivered + second.delivered
    assert sorted(reply.user_id for reply in delivered) == [str(user) for user in range(6)]
    for rig in (first, second):
        assert all(s.next_fire_at == utc(2027, 2, 2, 8) for s in await rig.schedules.list_all())


# -- restarts ----------------------------------------------------------------------
async def test_a_tick_missed_while_down_fires_once_within_grace_and_is_skipped_beyond(
    make_rig: RigFactory, llm_server: FakeLLMServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.set_handler(greet)
    data = tmp_path / "data"
    before = await make_rig(utc(2027, 3, 1, 7), data_dir=data, settings=NO_BACKOFF)
    await before.command("daily 08:00", user="1")
    await before.command("daily 08:00", user="2")
    await before.runtime.close(close_embedder=False)
    # The bot was down over 08:00. User 1's process comes back 10 minutes late: within grace.
    after = await make_rig(utc(2027, 3, 1, 8, 10), data_dir=data, settings=NO_BACKOFF)
    outcomes = await after.run(utc(2027, 3, 1, 8, 10))
    assert sorted((o.agent_key, o.fired) for o in outcomes) == [("discord:1", True), ("discord:2", True)]
    assert await after.run(utc(2027, 3, 1, 8, 11)) == []
    # Down again for the next one, back 2 hours late: skipped, logged, moved to the future.
    with caplog.at_level(logging.WARNING, logger="bot.checkins.scheduler"):
        outcomes = await after.run(utc(2027, 3, 2, 10))
    assert [(o.fired, o.next_fire_at) for o in outcomes] == [(False, utc(2027, 3, 3, 8))] * 2
    assert sum("skipped the tick due at 2027-03-02T08:00:00+00:00" in r.getMessage() for r in caplog.records) == 2
    assert len(ticks(llm_server)) == 2 and len(after.delivered) == 2


async def test_five_days_down_is_never_a_burst(make_rig: RigFactory, llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.set_handler(greet)
    data = tmp_path / "data"
    before = await make_rig(utc(2027, 3, 1, 7), data_dir=data, settings=NO_BACKOFF)
    await before.command("daily 08:00", user="1")
    await before.command("daily 08:00", user="2")
    await before.runtime.close(close_embedder=False)
    after = await make_rig(utc(2027, 3, 6, 8, 20), data_dir=data, settings=NO_BACKOFF)
    # User 1's process restarts 20 minutes after the fifth missed 08:00: that one (only) fires.
    first = await after.run(utc(2027, 3, 6, 8, 20))
    assert sorted((o.fired, o.next_fire_at) for o in first) == [(True, utc(2027, 3, 7, 8))] * 2
    for minute in range(21, 60):
        assert await after.run(utc(2027, 3, 6, 8, minute)) == []
    assert len(ticks(llm_server)) == 2


async def test_start_arms_a_timer_per_schedule_from_the_store(make_rig: RigFactory) -> None:
    rig = await make_rig(utc_now())
    await rig.command("every 5h", user="1")
    await rig.command("daily 08:00", user="2")
    await rig.command("pause", user="2")
    await rig.scheduler.start()
    try:
        schedules = {s.id: s for s in await rig.schedules.list_all()}
        armed = rig.scheduler.armed()
        assert list(armed) == [s.id for s in schedules.values() if not s.paused]
        assert all(armed[i] == schedules[i].next_fire_at for i in armed)
        # Another process removes it: the resync disarms it.
        await rig.schedules.delete(next(iter(armed)))
        await rig.scheduler.resync()
        assert rig.scheduler.armed() == {}
    finally:
        await rig.scheduler.stop()


# -- back-off ----------------------------------------------------------------------
async def test_unanswered_ticks_back_off_and_a_user_message_resets(
    make_rig: RigFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(greet)
    # Far enough ahead of the real clock that recall timestamps (real time) are
    # all older than these ticks: only the activity hook resets the back-off here.
    rig = await make_rig(utc(2030, 1, 1, 7), settings=CheckinSettings(backoff_after=2, max_backoff_days=14))
    await rig.command("daily 08:00")
    moment, gaps = utc(2030, 1, 1, 8), []
    for _ in range(5):
        (outcome,) = await rig.run(moment)
        assert outcome.next_fire_at is not None
        gaps.append((outcome.next_fire_at - moment).days)
        moment = outcome.next_fire_at
    assert gaps == [1, 2, 3, 5, 9]  # ticks on the 1st, 2nd, 4th, 7th, 12th; next the 21st
    assert "They have not answered your last 4 check-ins" in ticks(llm_server)[-1]
    # The person writes back two days later.
    rig.clock.now = utc(2030, 1, 14, 9)
    await rig.runtime.handle(UserMessage(platform="discord", user_id="42", text="sorry, busy month!"))
    await rig.scheduler.user_active("discord:42", rig.clock.now)
    schedule = await rig.only()
    assert (schedule.unanswered, schedule.next_fire_at) == (0, utc(2030, 1, 15, 8))
    (outcome,) = await rig.run(utc(2030, 1, 15, 8))
    assert outcome.next_fire_at == utc(2030, 1, 16, 8)


async def test_a_reply_found_in_recall_resets_the_backoff_without_the_hook(
    make_rig: RigFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(greet)
    # Ticks in the past of the real clock, then a real message: recall shows it
    # came after the last tick.
    base = (utc_now() - timedelta(days=30)).replace(hour=8, minute=0, second=0, microsecond=0)
    rig = await make_rig(base - timedelta(hours=1))
    await rig.command("daily 08:00")
    for day in range(2):
        await rig.run(base + timedelta(days=day))
    assert (await rig.only()).unanswered == 2
    await rig.runtime.handle(UserMessage(platform="discord", user_id="42", text="hi, I'm back"))
    (outcome,) = await rig.run(base + timedelta(days=3))  # the backed-off time
    schedule = await rig.only()
    assert schedule.unanswered == 1  # reset to 0, then this tick
    assert outcome.next_fire_at == base + timedelta(days=4)  # the regular next day
    assert "have not answered" not in ticks(llm_server)[-1]


# -- the reminder function -----------------------------------------------------------
def last_tool(request: dict[str, Any]) -> dict[str, Any]:
    message = request["messages"][-1]
    assert message["role"] == "tool", message
    return json.loads(message["content"])


async def test_schedule_reminder_errors_reach_the_model_and_a_reminder_fires_once(
    make_rig: RigFactory, llm_server: FakeLLMServer
) -> None:
    now = utc(2027, 5, 3, 10)
    rig = await make_rig(now, settings=CheckinSettings(max_reminders=1))
    await rig.command("tz Europe/Paris")

    def remind(when: str, heartbeat: bool = True) -> Any:
        return reply_tool_calls(
            tool_call(
                "schedule_reminder", {"when": when, "note": "ask how the dentist went", "request_heartbeat": heartbeat}
            )
        )

    llm_server.script(
        remind("2027-05-01T09:00"),
        remind("in 10 seconds"),
        remind("sometime soonish"),
        remind("in 2 hours"),
        remind("tomorrow 09:00"),
        reply_tool_calls(tool_call("send_message", {"message": "I'll check in after your dentist visit."})),
    )
    replies = await rig.runtime.handle(
        UserMessage(
            platform="discord", user_id="42", text="dentist at noon", reply_to={"channel": "C55", "thread": "t1"}
        )
    )
    assert [r.text for r in replies] == ["I'll check in after your dentist visit."]
    results = [last_tool(request) for request in llm_server.requests[1:6]]
    assert [r["status"] for r in results] == ["Failed", "Failed", "Failed", "OK", "Failed"]
    assert "in the past" in results[0]["result"]
    assert "too soon" in results[1]["result"] and "at least 1 minute" in results[1]["result"]
    assert "cannot read 'sometime soonish'" in results[2]["result"]
    assert "Mon 3 May 14:00 Europe/Paris" in results[3]["result"]
    assert "1 pending reminders, the most allowed" in results[4]["result"]
    (reminder,) = await rig.schedules.list_for_user("discord:42")
    assert (reminder.kind, reminder.run_at, reminder.reply_to) == (
        "once",
        utc(2027, 5, 3, 12),
        {"channel": "C55", "thread": "t1"},
    )
    llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "How did the dentist go?"})))
    assert await rig.run(utc(2027, 5, 3, 11, 59)) == []
    (outcome,) = await rig.run(utc(2027, 5, 3, 12))
    assert outcome.fired and outcome.next_fire_at is None
    assert "ask how the dentist went" in ticks(llm_server)[0]
    assert [(r.reply_to, r.text) for r in rig.delivered] == [
        ({"channel": "C55", "thread": "t1"}, "How did the dentist go?")
    ]
    assert await rig.run(utc(2027, 5, 3, 12, 1)) == [] and await rig.run(utc(2027, 5, 4, 12)) == []
    assert await rig.schedules.list_for_user("discord:42") == []


# -- never interrupting ------------------------------------------------------------
class Watched:
    """The runtime as the scheduler sees it, telling the test when a tick is submitted."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.submitted = asyncio.Event()

    @property
    def store(self) -> Store:
        return self.runtime.store

    async def handle_with_details(self, event: Event) -> EventResult:
        self.submitted.set()
        return await self.runtime.handle_with_details(event)


async def test_a_tick_waits_for_the_users_event_in_flight(make_rig: RigFactory, llm_server: FakeLLMServer) -> None:
    rig = await make_rig(utc(2027, 6, 1, 7))
    await rig.command("daily 08:00")
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def model(request: dict[str, Any]) -> Any:
        last = request["messages"][-1]
        if last["role"] == "user" and "long question" in (last["content"] or ""):
            order.append("user step 1")
            started.set()
            release.wait(10)  # the user's event is mid-chain until the test says so
            return reply_tool_calls(tool_call("conversation_search", {"query": "x", "request_heartbeat": True}))
        if "[scheduled tick]" in (last.get("content") or ""):
            order.append("tick")
            return greet(request)
        order.append("user step 2")
        return reply_tool_calls(tool_call("send_message", {"message": "Here is my long answer."}))

    llm_server.set_handler(model)
    watched = Watched(rig.runtime)
    rig.scheduler.runtime = watched
    user = asyncio.create_task(rig.runtime.handle(UserMessage(platform="discord", user_id="42", text="long question")))
    assert await asyncio.to_thread(started.wait, 10)
    tick = asyncio.create_task(rig.run(utc(2027, 6, 1, 8)))
    await asyncio.wait_for(watched.submitted.wait(), 10)
    assert not tick.done()
    release.set()
    replies, outcomes = await asyncio.gather(user, tick)
    assert [r.text for r in replies] == ["Here is my long answer."]
    assert len(outcomes) == 1 and outcomes[0].fired
    assert order == ["user step 1", "user step 2", "tick"]
