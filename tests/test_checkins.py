"""Check-in time logic (zones, daylight saving, quiet hours, back-off, parsing)
and the schedule store (CRUD, the claim compare-and-set, user activity)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.checkins.rules import (
    Schedule,
    backoff_skips,
    format_local,
    humanize,
    in_quiet_hours,
    next_fire,
    next_fire_with_backoff,
    parse_clock,
    parse_timezone,
    parse_weekday,
    parse_when,
)
from bot.errors import ConfigError
from bot.settings import CheckinSettings
from memory.schedules import CheckinPrefs, ScheduleStore
from memory.sqlite.store import SQLiteStore
from tests.mongo_server import shared_target


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def daily(clock: str = "09:00", tz: str = "Europe/Paris", **fields: object) -> Schedule:
    return Schedule(
        id="s1",
        agent_key="discord:1",
        platform="discord",
        user_id="1",
        kind="daily",
        timezone=tz,
        time_of_day=clock,
        **fields,
    )  # type: ignore[arg-type]


def fires(schedule: Schedule, after: datetime, count: int) -> list[datetime]:
    found: list[datetime] = []
    for _ in range(count):
        moment = next_fire(schedule, after)
        assert moment is not None
        found.append(moment)
        after = moment
    return found


# -- time logic ----------------------------------------------------------------
def test_daily_in_paris_follows_daylight_saving_both_ways() -> None:
    schedule = daily()
    # 09:00 in Paris is 08:00 UTC in winter (CET) and 07:00 UTC in summer (CEST).
    assert fires(schedule, utc(2026, 3, 27, 12), 3) == [utc(2026, 3, 28, 8), utc(2026, 3, 29, 7), utc(2026, 3, 30, 7)]
    assert fires(schedule, utc(2026, 10, 23, 12), 3) == [
        utc(2026, 10, 24, 7),
        utc(2026, 10, 25, 8),
        utc(2026, 10, 26, 8),
    ]


def test_next_fire_is_strictly_after() -> None:
    assert next_fire(daily(tz="UTC"), utc(2026, 5, 1, 9)) == utc(2026, 5, 2, 9)
    assert next_fire(daily(tz="UTC"), utc(2026, 5, 1, 8, 59, 59)) == utc(2026, 5, 1, 9)


def test_weekly_in_new_york_and_every_n_hours() -> None:
    weekly = Schedule(
        id="w",
        agent_key="k",
        platform="p",
        user_id="u",
        kind="weekly",
        timezone="America/New_York",
        time_of_day="18:30",
        weekday=0,
    )
    # Monday 30 Nov 2026, 18:30 EST = 23:30 UTC; a week later, same.
    assert fires(weekly, utc(2026, 11, 29), 2) == [utc(2026, 11, 30, 23, 30), utc(2026, 12, 7, 23, 30)]
    # Across the US spring change (8 March 2026): 18:30 EDT = 22:30 UTC.
    assert fires(weekly, utc(2026, 3, 3), 2) == [utc(2026, 3, 9, 22, 30), utc(2026, 3, 16, 22, 30)]
    every = Schedule(
        id="i",
        agent_key="k",
        platform="p",
        user_id="u",
        kind="interval",
        every_hours=4,
        created_at=utc(2026, 11, 30, 10, 17, 42),
    )
    # Real elapsed hours, anchored on the minute it was set up.
    assert fires(every, utc(2026, 11, 30, 10, 17, 42), 3) == [
        utc(2026, 11, 30, 14, 17),
        utc(2026, 11, 30, 18, 17),
        utc(2026, 11, 30, 22, 17),
    ]


def test_quiet_hours_move_a_fire_time_to_their_end() -> None:
    wrapping = daily("07:00", quiet_start="22:00", quiet_end="08:00")
    assert next_fire(wrapping, utc(2026, 6, 1, 12)) == utc(2026, 6, 2, 6)  # 08:00 Paris summer time
    assert in_quiet_hours(wrapping, utc(2026, 6, 1, 21)) and not in_quiet_hours(wrapping, utc(2026, 6, 1, 19))
    same_day = daily("12:30", tz="UTC", quiet_start="12:00", quiet_end="14:00")
    assert next_fire(same_day, utc(2026, 6, 1)) == utc(2026, 6, 1, 14)
    every = Schedule(
        id="i",
        agent_key="k",
        platform="p",
        user_id="u",
        kind="interval",
        every_hours=1,
        timezone="UTC",
        quiet_start="23:00",
        quiet_end="06:00",
        created_at=utc(2026, 6, 1, 20),
    )
    # The hourly ticks of the night collapse into one at 06:00, then hourly again.
    assert fires(every, utc(2026, 6, 1, 21, 30), 4) == [
        utc(2026, 6, 1, 22),
        utc(2026, 6, 2, 6),
        utc(2026, 6, 2, 7),
        utc(2026, 6, 2, 8),
    ]


def test_a_reminder_fires_once() -> None:
    once = Schedule(id="o", agent_key="k", platform="p", user_id="u", kind="once", run_at=utc(2026, 6, 1, 15))
    assert next_fire(once, utc(2026, 6, 1)) == utc(2026, 6, 1, 15)
    assert next_fire(once, utc(2026, 6, 1, 15)) is None


def test_backoff_spreads_unanswered_ticks_up_to_the_cap() -> None:
    settings = CheckinSettings(backoff_after=2, max_backoff_days=14)
    schedule = daily("08:00", tz="UTC")
    assert [backoff_skips(n, settings) for n in range(7)] == [0, 0, 1, 2, 4, 8, 16]
    moment, gaps = utc(2026, 11, 1, 8), []
    for unanswered in range(1, 9):
        following = next_fire_with_backoff(schedule, moment, unanswered, settings)
        assert following is not None
        gaps.append((following - moment).days)
        moment = following
    assert gaps == [1, 2, 3, 5, 9, 14, 14, 14]
    assert backoff_skips(50, CheckinSettings(backoff_after=0)) == 0  # 0 turns it off


def test_settings_from_env() -> None:
    env = {"MEMGPT_CHECKIN_BACKOFF_AFTER": "3", "MEMGPT_CHECKIN_GRACE_MINUTES": "5", "MEMGPT_MAX_REMINDERS": "7"}
    settings = CheckinSettings.from_env(env)
    assert (settings.backoff_after, settings.grace_minutes, settings.max_reminders) == (3, 5, 7)
    assert settings.max_backoff_days == 14 and settings.min_reminder_minutes == 1
    with pytest.raises(ConfigError, match="MEMGPT_MAX_REMINDERS"):
        CheckinSettings.from_env({"MEMGPT_MAX_REMINDERS": "lots"})
    with pytest.raises(ConfigError, match="at least 1"):
        CheckinSettings.from_env({"MEMGPT_CHECKIN_MAX_BACKOFF_DAYS": "0"})


# -- parsing -------------------------------------------------------------------
NOW = utc(2026, 11, 30, 10)  # a Monday, 11:00 in Paris


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("in 2 hours", utc(2026, 11, 30, 12)),
        ("in 1h30m", utc(2026, 11, 30, 11, 30)),
        ("in an hour", utc(2026, 11, 30, 11)),
        ("in two days and 3 hours", utc(2026, 12, 2, 13)),
        ("tomorrow 09:00", utc(2026, 12, 1, 8)),
        ("tomorrow at 9am", utc(2026, 12, 1, 8)),
        ("today 18:00", utc(2026, 11, 30, 17)),
        ("friday 18:30", utc(2026, 12, 4, 17, 30)),
        ("mon 10:00", utc(2026, 12, 7, 9)),  # 10:00 today has passed: next Monday
        ("18:00", utc(2026, 11, 30, 17)),
        ("09:00", utc(2026, 12, 1, 8)),
        ("2026-12-01T15:00", utc(2026, 12, 1, 14)),  # no zone: the user's
        ("2026-12-01 15:00Z", utc(2026, 12, 1, 15)),
        ("2026-12-01T15:00-05:00", utc(2026, 12, 1, 20)),
    ],
)
def test_parse_when(text: str, expected: datetime) -> None:
    assert parse_when(text, NOW, "Europe/Paris") == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("whenever", "cannot read"),
        ("2026-12-01", "no time of day"),
        ("in 3 parsecs", "cannot read"),
        ("tomorrow", "cannot read"),
        ("blursday 09:00", "cannot read"),
        ("in 99999999999 weeks", "too far"),
    ],
)
def test_parse_when_errors(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_when(text, NOW, None)


def test_parse_clock_weekday_zone_and_words() -> None:
    assert parse_clock("9:05").strftime("%H:%M") == "09:05"
    assert parse_clock("6:30 pm").strftime("%H:%M") == "18:30"
    assert parse_clock("12am").strftime("%H:%M") == "00:00"
    for bad in ("24:00", "9", "09:60", "noon", "13pm"):
        with pytest.raises(ValueError, match="time of day"):
            parse_clock(bad)
    assert [parse_weekday(day) for day in ("mon", "Tuesday", "th", "sun")] == [0, 1, 3, 6]
    with pytest.raises(ValueError, match="day of the week"):
        parse_weekday("t")
    assert parse_timezone("Europe/Paris") == "Europe/Paris" and parse_timezone("utc") == "UTC"
    with pytest.raises(ValueError, match="IANA"):
        parse_timezone("Mars/Olympus")
    assert format_local(NOW, "Europe/Paris") == "Mon 30 Nov 11:00 Europe/Paris"
    assert [humanize(timedelta(seconds=s)) for s in (5, 60, 7200, 3 * 86400)] == [
        "less than a minute",
        "1 minute",
        "2 hours",
        "3 days",
    ]
    # A reminder "in 2 hours" is confirmed a moment later, 1:59:59 away: still "2 hours".
    assert humanize(timedelta(hours=2) - timedelta(seconds=1)) == "2 hours"
    assert humanize(timedelta(minutes=59, seconds=50)) == "1 hour"


# -- the store -----------------------------------------------------------------
async def _sqlite(path: Path) -> tuple[ScheduleStore, Callable[[], Awaitable[None]]]:
    backend = SQLiteStore(path / "memgpt.sqlite3")
    await backend.open()
    return backend.schedules, backend.close


async def _mongodb(path: Path) -> tuple[ScheduleStore, Callable[[], Awaitable[None]]]:
    # FerretDB (or MONGODB_TEST_URI): a fresh database, dropped when the store closes.
    backend = shared_target().store()
    await backend.open()
    return backend.schedules, backend.close


# One factory per backend, so both pass the same tests.
FACTORIES: dict[str, Callable[[Path], Awaitable[tuple[ScheduleStore, Callable[[], Awaitable[None]]]]]] = {
    "sqlite": _sqlite,
    "mongodb": _mongodb,
}


@pytest.fixture(params=sorted(FACTORIES))
async def schedules(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ScheduleStore]:
    store, close = await FACTORIES[request.param](tmp_path)
    try:
        yield store
    finally:
        await close()


def new(key: str = "slack:T1:U1", **fields: object) -> Schedule:
    platform, _, user = key.partition(":")
    values: dict[str, object] = {"kind": "daily", "time_of_day": "09:00", "next_fire_at": utc(2026, 12, 1, 9)}
    values.update(fields)
    return Schedule(id="", agent_key=key, platform=platform, user_id=user, **values)  # type: ignore[arg-type]


async def test_store_round_trip_and_user_scoping(schedules: ScheduleStore) -> None:
    first = await schedules.add(new(reply_to={"channel": "D1", "thread": None}, note="plan the day"))
    second = await schedules.add(new(kind="interval", every_hours=4, time_of_day=None))
    other = await schedules.add(new("discord:9"))
    assert len({first.id, second.id, other.id}) == 3 and len(first.id) == 6
    loaded = await schedules.get(first.id)
    assert loaded is not None
    assert (loaded.reply_to, loaded.note, loaded.next_fire_at) == (
        {"channel": "D1", "thread": None},
        "plan the day",
        utc(2026, 12, 1, 9),
    )
    assert [s.id for s in await schedules.list_for_user("slack:T1:U1")] == [first.id, second.id]
    assert len(await schedules.list_all()) == 3
    loaded.paused, loaded.timezone, loaded.next_fire_at = True, "Asia/Tokyo", utc(2026, 12, 2)
    assert await schedules.update(loaded)
    again = await schedules.get(first.id)
    assert again is not None and again.paused and again.timezone == "Asia/Tokyo"
    assert [s.id for s in await schedules.list_due(utc(2026, 12, 5))] == [second.id, other.id]  # paused left out
    assert await schedules.delete(second.id) and not await schedules.delete(second.id)
    await schedules.save_prefs(CheckinPrefs("slack:T1:U1", "Europe/Paris", "22:00", "07:00"))
    assert await schedules.get_prefs("slack:T1:U1") == CheckinPrefs("slack:T1:U1", "Europe/Paris", "22:00", "07:00")
    assert await schedules.get_prefs("discord:9") == CheckinPrefs("discord:9")
    assert await schedules.delete_for_agent_key("slack:T1:U1") == 1
    assert await schedules.list_for_user("slack:T1:U1") == []
    assert await schedules.get_prefs("slack:T1:U1") == CheckinPrefs("slack:T1:U1")
    assert [s.id for s in await schedules.list_all()] == [other.id]


async def test_claim_is_a_compare_and_set(schedules: ScheduleStore) -> None:
    due = utc(2026, 12, 1, 9)
    schedule = await schedules.add(new())
    results = await asyncio.gather(
        *(schedules.claim(schedule.id, due, utc(2026, 12, 2, 9), f"owner{n}", fired_at=due) for n in range(5))
    )
    assert sorted(results) == [False] * 4 + [True]
    claimed = await schedules.get(schedule.id)
    assert claimed is not None
    assert (claimed.next_fire_at, claimed.unanswered, claimed.last_fired_at) == (utc(2026, 12, 2, 9), 1, due)
    # Advancing without firing (a skipped stale tick) leaves the firing state alone.
    assert await schedules.claim(schedule.id, utc(2026, 12, 2, 9), utc(2026, 12, 3, 9), "x")
    assert (await schedules.get(schedule.id)).unanswered == 1  # type: ignore[union-attr]
    # Paused schedules are never claimed; None deletes (a reminder that is done).
    paused = await schedules.add(new(paused=True))
    assert not await schedules.claim(paused.id, due, None, "x")
    once = await schedules.add(new(kind="once", run_at=due, time_of_day=None))
    assert await schedules.claim(once.id, due, None, "x") and await schedules.get(once.id) is None


async def test_claim_across_two_connections_on_one_file(tmp_path: Path) -> None:
    stores = [SQLiteStore(tmp_path / "shared.sqlite3") for _ in range(2)]
    for backend in stores:
        await backend.open()
    try:
        a, b = (backend.schedules for backend in stores)
        due = utc(2026, 12, 1, 9)
        added = [await a.add(new(f"discord:{n}")) for n in range(10)]
        wins = await asyncio.gather(
            *(
                store.claim(s.id, due, due + timedelta(days=1), name, fired_at=due)
                for s in added
                for store, name in ((a, "a"), (b, "b"))
            )
        )
        assert sum(wins) == 10
        assert all(s.unanswered == 1 for s in await b.list_all())
    finally:
        for backend in stores:
            await backend.close()


async def test_user_activity_resets_unanswered_counts(schedules: ScheduleStore) -> None:
    due = utc(2026, 12, 1, 9)
    schedule = await schedules.add(new())
    for day in range(3):
        fired = due + timedelta(days=day)
        assert await schedules.claim(schedule.id, fired, fired + timedelta(days=1), "x", fired_at=fired)
    # Activity before the last tick is not an answer to it.
    assert await schedules.mark_user_activity(schedule.agent_key, utc(2026, 12, 2, 12)) == []
    reset = await schedules.mark_user_activity(schedule.agent_key, utc(2026, 12, 3, 10))
    assert [(s.id, s.unanswered) for s in reset] == [(schedule.id, 3)]
    assert (await schedules.get(schedule.id)).unanswered == 0  # type: ignore[union-attr]
    assert await schedules.mark_user_activity(schedule.agent_key, utc(2026, 12, 3, 11)) == []
