"""The platform-neutral `/checkin` command and `memgpt-bot checkins list`."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.checkins.commands import checkin_command
from bot.config import Settings
from bot.settings import CheckinSettings
from cli.checkins import add_checkin_commands
from memory.schedules import ScheduleStore
from memory.sqlite.store import SQLiteStore

NOW = datetime(2026, 11, 30, 10, tzinfo=UTC)  # Monday; 11:00 in Paris
DM = {"channel": "D9"}


@pytest.fixture
async def schedules(tmp_path: Path) -> AsyncIterator[ScheduleStore]:
    store = SQLiteStore(tmp_path / "data" / "memgpt.sqlite3")
    await store.open()
    yield store.schedules
    await store.close()


async def run(schedules: ScheduleStore, text: str, user: str = "U1", **options: object) -> str:
    return await checkin_command("slack", f"T1:{user}", text, DM, schedules, lambda: NOW, **options)  # type: ignore[arg-type]


async def test_daily_weekly_every_and_list(schedules: ScheduleStore) -> None:
    answer = await run(schedules, "tz Europe/Paris")
    assert "Time zone set to Europe/Paris (it is Mon 30 Nov 11:00 Europe/Paris)" in answer
    daily = await run(schedules, "daily 9:00 plan the day")
    assert daily.startswith("Done: check-in ") and "daily at 09:00. Next: Tue 1 Dec 09:00 Europe/Paris." in daily
    assert "weekly on Friday at 18:30. Next: Fri 4 Dec 18:30" in await run(schedules, "weekly fri 6:30pm")
    assert "every 4 hours. Next: Mon 30 Nov 15:00" in await run(schedules, "every 4h")
    assert "every 2 hours" in await run(schedules, "every 2 hours")
    assert "already have that one" in await run(schedules, "daily 09:00")
    listing = await run(schedules, "list")
    assert listing.splitlines()[0] == "Your check-ins (zone Europe/Paris):"
    assert "daily at 09:00 (plan the day): next Tue 1 Dec 09:00" in listing
    assert len(listing.splitlines()) == 5
    stored = await schedules.list_for_user("slack:T1:U1")
    assert all(s.reply_to == DM and s.platform == "slack" and s.user_id == "T1:U1" for s in stored)


async def test_zone_and_quiet_hours_carry_into_existing_checkins(schedules: ScheduleStore) -> None:
    assert "Times are UTC until you set your zone" in await run(schedules, "daily 09:00")
    (before,) = await schedules.list_for_user("slack:T1:U1")
    assert before.next_fire_at == datetime(2026, 12, 1, 9, tzinfo=UTC)
    assert "1 check-in now follows it" in await run(schedules, "tz Asia/Tokyo")
    (after,) = await schedules.list_for_user("slack:T1:U1")
    assert (after.timezone, after.next_fire_at) == ("Asia/Tokyo", datetime(2026, 12, 1, 0, tzinfo=UTC))
    assert "Quiet hours set: 08:30-10:00 (Asia/Tokyo)" in await run(schedules, "quiet 8:30-10:00")
    (quiet,) = await schedules.list_for_user("slack:T1:U1")
    assert quiet.next_fire_at == datetime(2026, 12, 1, 1, tzinfo=UTC)  # 10:00 Tokyo
    assert "Quiet hours: 08:30-10:00" in await run(schedules, "quiet")
    assert "Quiet hours off" in await run(schedules, "quiet off")
    assert "Your time zone is Asia/Tokyo" in await run(schedules, "tz")


async def test_pause_resume_remove_by_id_and_all(schedules: ScheduleStore) -> None:
    await run(schedules, "daily 09:00")
    await run(schedules, "every 6h")
    first, second = await schedules.list_for_user("slack:T1:U1")
    assert await run(schedules, f"pause {first.id}") == f"Paused: {first.id}."
    assert "paused" in (await run(schedules, "list")).splitlines()[1]
    assert await run(schedules, "pause") == f"Paused: {first.id}, {second.id}."
    assert await run(schedules, "resume all") == f"Resumed: {first.id}, {second.id}."
    assert not any(s.paused for s in await schedules.list_for_user("slack:T1:U1"))
    # Another user cannot touch them, even knowing the id.
    assert "no check-ins" in await run(schedules, f"remove {first.id}", user="U2")
    await run(schedules, "daily 10:00", user="U2")
    assert "You have no check-in" in await run(schedules, f"remove {first.id}", user="U2")
    assert await run(schedules, f"remove #{first.id}") == f"Removed: {first.id}."
    assert await run(schedules, "remove all") == f"Removed: {second.id}."
    assert "No check-ins yet" in await run(schedules, "list")
    assert len(await schedules.list_all()) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("daily", "`/checkin daily 09:00`"),
        ("daily 25:00", "'25:00' is not a time of day"),
        ("daily noon", "For example: `/checkin daily 09:00`"),
        ("weekly 18:30", "For example: `/checkin weekly mon 18:30`"),
        ("weekly someday 18:30", "'someday' is not a day of the week"),
        ("every", "`/checkin every 4h`"),
        ("every 0h", "Between 1 and 168 hours"),
        ("every soon", "'soon' is not a number of hours"),
        ("tz Mars/Olympus", "For example: `/checkin tz Europe/Paris`"),
        ("quiet 22:00", "Give a start and an end"),
        ("quiet 22:00-22:00", "Start and end are the same time"),
        ("pause", "You have no check-ins"),
        ("remove", "`/checkin remove ID`"),
        ("dance", "I don't know `/checkin dance`"),
    ],
)
async def test_invalid_input_gets_a_clear_message_with_an_example(
    schedules: ScheduleStore, text: str, expected: str
) -> None:
    assert expected in await run(schedules, text)


async def test_help_limits_and_change_notice(schedules: ScheduleStore) -> None:
    assert "/checkin daily 09:00" in await run(schedules, "") and "quiet" in await run(schedules, "help")
    changes: list[str] = []

    async def changed() -> None:
        changes.append("x")

    settings = CheckinSettings(max_checkins=2)
    await run(schedules, "daily 09:00", settings=settings, on_change=changed)
    await run(schedules, "daily 10:00", settings=settings, on_change=changed)
    assert "the most I keep" in await run(schedules, "daily 11:00", settings=settings, on_change=changed)
    await run(schedules, "list", on_change=changed)
    assert changes == ["x", "x"]  # only what changed something


async def test_cli_lists_every_schedule(
    schedules: ScheduleStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await run(schedules, "tz Europe/Paris")
    await run(schedules, "daily 09:00")
    await run(schedules, "every 3h", user="U2")
    await run(schedules, "pause", user="U2")
    parser = argparse.ArgumentParser()
    add_checkin_commands(parser.add_subparsers(dest="command"))
    settings = Settings(data_dir=tmp_path / "data")
    args = parser.parse_args(["checkins", "list"])
    assert await args.func(args, settings) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "USER", "WHAT", "ZONE", "NEXT", "(UTC)", "NEXT", "(LOCAL)", "STATE"]
    assert "slack:T1:U1" in lines[1] and "Europe/Paris" in lines[1] and "2026-12-01 08:00" in lines[1]
    assert "Tue 1 Dec 09:00" in lines[1] and lines[1].endswith("active")
    assert "slack:T1:U2" in lines[2] and lines[2].endswith("paused")
    args = parser.parse_args(["checkins", "list", "--json"])
    await args.func(args, settings)
    listed = json.loads(capsys.readouterr().out)
    assert [(item["user"], item["paused"]) for item in listed] == [("slack:T1:U1", False), ("slack:T1:U2", True)]
