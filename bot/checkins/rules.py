"""Proactive check-ins: the schedule model and pure time logic (no I/O).

Recurring times come from APScheduler's triggers in the user's IANA zone (they
handle daylight saving); this module only adds what the bot needs on top:
quiet hours, back-off after unanswered ticks, and parsing what people and the
model type ("daily 09:00", "in 2 hours", "tomorrow 09:00").
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.reports import plural
from bot.settings import CheckinSettings
from memory.schedules import SCHEDULE_KINDS, CheckinPrefs, Schedule, ScheduleKind, whole_seconds

__all__ = [
    "SCHEDULE_KINDS",
    "WEEKDAYS",
    "CheckinPrefs",
    "Schedule",
    "ScheduleKind",
    "backoff_skips",
    "describe",
    "format_local",
    "humanize",
    "in_quiet_hours",
    "next_fire",
    "next_fire_with_backoff",
    "parse_clock",
    "parse_timezone",
    "parse_weekday",
    "parse_when",
    "tick_reason",
]

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_CRON_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
# Bounds the walk over occurrences (back-off, quiet hours): a year of hourly ticks.
_MAX_STEPS = 10_000
_TICK = timedelta(microseconds=1)


# -- parsing what people type ------------------------------------------------
_CLOCK = re.compile(r"^(\d{1,2})(?::(\d{2}))?\s*(am|pm)?$")


def parse_clock(text: str, *, bare_hour: bool = False) -> time:
    """ "09:00", "9:30", "18:30", "9am", "6:30 pm" (and "9" if `bare_hour`)."""
    match = _CLOCK.match(text.strip().lower())
    if not match or (match[2] is None and match[3] is None and not bare_hour):
        raise ValueError(f"{text!r} is not a time of day; use HH:MM, e.g. 09:00 or 18:30")
    hour, minute = int(match[1]), int(match[2] or 0)
    if match[3]:
        if not 1 <= hour <= 12:
            raise ValueError(f"{text!r} is not a time of day; with am/pm the hour is 1-12")
        hour = hour % 12 + (12 if match[3] == "pm" else 0)
    if hour > 23 or minute > 59:
        raise ValueError(f"{text!r} is not a time of day; use HH:MM between 00:00 and 23:59")
    return time(hour, minute)


def hhmm(moment: time) -> str:
    return f"{moment.hour:02d}:{moment.minute:02d}"


def parse_weekday(text: str) -> int:
    word = text.strip().lower().rstrip(".")
    for number, name in enumerate(WEEKDAYS):
        # Any two letters tell the days apart (tu/th, sa/su).
        if len(word) >= 2 and name.startswith(word):
            return number
    raise ValueError(f"{text!r} is not a day of the week; use mon, tue, wed, thu, fri, sat or sun")


def parse_timezone(name: str) -> str:
    """A valid IANA zone name ("Europe/Paris"), or ValueError."""
    raw = name.strip()
    if raw.upper() in ("UTC", "Z", "GMT"):
        return "UTC"
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{raw!r} is not a time zone I know; use an IANA name such as Europe/Paris or America/New_York"
        ) from None
    return raw


def zone(name: str | None) -> tzinfo:
    if not name or name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC  # a zone removed from the tz database: keep the schedule working


_UNITS = {
    "s": "seconds",
    "sec": "seconds",
    "secs": "seconds",
    "second": "seconds",
    "seconds": "seconds",
    "m": "minutes",
    "min": "minutes",
    "mins": "minutes",
    "minute": "minutes",
    "minutes": "minutes",
    "h": "hours",
    "hr": "hours",
    "hrs": "hours",
    "hour": "hours",
    "hours": "hours",
    "d": "days",
    "day": "days",
    "days": "days",
    "w": "weeks",
    "week": "weeks",
    "weeks": "weeks",
}
_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "fifteen": 15,
    "twenty": 20,
    "thirty": 30,
    "half an": 0.5,
    "half a": 0.5,
}
_AMOUNT = re.compile(r"(\d+(?:\.\d+)?|half an?|[a-z]+)\s*([a-z]+)\s*(?:,|and)?\s*")
_DAY_TIME = re.compile(r"^(?:on\s+|next\s+)?([a-z]+)(?:\s+at)?\s+(.+)$")
WHEN_HINT = "use an ISO time like 2026-12-01T15:00, or 'in 2 hours', 'tomorrow 09:00', 'friday 18:30'"


def parse_when(text: str, now: datetime, tz_name: str | None) -> datetime:
    """When a reminder should fire, as UTC. A time without a zone is in the
    user's zone. Raises ValueError saying what was wrong."""
    raw = " ".join(text.strip().split())
    lowered = raw.lower().rstrip(".")
    tz = zone(tz_name)
    local_now = now.astimezone(tz)
    if lowered.startswith("in "):
        try:
            return now + _parse_duration(lowered[3:], raw)
        except OverflowError:
            raise ValueError(f"{raw!r} is too far in the future") from None
    if re.match(r"^\d{4}-\d{2}-\d{2}", raw):
        return _parse_iso(raw, tz)
    day_time = _DAY_TIME.match(lowered)
    if day_time and day_time[1] in ("today", "tomorrow"):
        clock = parse_clock(day_time[2], bare_hour=True)
        day = local_now.date() + timedelta(days=int(day_time[1] == "tomorrow"))
        return _local(day, clock, tz)
    if day_time and day_time[1].isalpha() and day_time[1] != "at":
        try:
            weekday = parse_weekday(day_time[1])
        except ValueError:
            raise ValueError(f"cannot read {raw!r}: {WHEN_HINT}") from None
        clock = parse_clock(day_time[2], bare_hour=True)
        for ahead in range(8):
            day = local_now.date() + timedelta(days=ahead)
            if day.weekday() == weekday and _local(day, clock, tz) > now:
                return _local(day, clock, tz)
    try:
        clock = parse_clock(lowered.removeprefix("at "))
    except ValueError:
        raise ValueError(f"cannot read {raw!r}: {WHEN_HINT}") from None
    today = _local(local_now.date(), clock, tz)
    return today if today > now else _local(local_now.date() + timedelta(days=1), clock, tz)


def _parse_duration(text: str, raw: str) -> timedelta:
    total = timedelta()
    position = 0
    while position < len(text):
        match = _AMOUNT.match(text, position)
        unit = _UNITS.get(match[2]) if match else None
        if not match or unit is None:
            raise ValueError(f"cannot read {raw!r}: {WHEN_HINT}")
        amount = _NUMBERS.get(match[1])
        if amount is None and not match[1][0].isdigit():
            raise ValueError(f"cannot read {raw!r}: {WHEN_HINT}")
        total += timedelta(**{unit: float(match[1]) if amount is None else amount})
        position = match.end()
    if not total:
        raise ValueError(f"cannot read {raw!r}: {WHEN_HINT}")
    return total


def _parse_iso(raw: str, tz: tzinfo) -> datetime:
    if len(raw) == 10:
        raise ValueError(f"{raw!r} has no time of day; add one, e.g. {raw}T09:00")
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot read {raw!r}: {WHEN_HINT}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz)
    return moment.astimezone(UTC)


def _local(day: date, clock: time, tz: tzinfo) -> datetime:
    return datetime.combine(day, clock, tzinfo=tz).astimezone(UTC)


# -- when a schedule fires ---------------------------------------------------
def _trigger(schedule: Schedule) -> CronTrigger | IntervalTrigger | None:
    if schedule.kind in ("daily", "weekly"):
        clock = parse_clock(schedule.time_of_day or "09:00")
        day = _CRON_DAYS[schedule.weekday or 0] if schedule.kind == "weekly" else None
        return CronTrigger(day_of_week=day, hour=clock.hour, minute=clock.minute, timezone=zone(schedule.timezone))
    if schedule.kind == "interval":
        # Anchored on the minute the schedule was made, so "every 4h" set at
        # 10:17 runs 14:17, 18:17, ... (IntervalTrigger would otherwise anchor
        # on its own construction time, which is neither stable nor testable).
        every = timedelta(hours=max(1, schedule.every_hours or 1))
        anchor = schedule.created_at.astimezone(UTC).replace(second=0, microsecond=0) + every
        return IntervalTrigger(hours=max(1, schedule.every_hours or 1), start_date=anchor, timezone=UTC)
    return None


def _raw_next(schedule: Schedule, after: datetime) -> datetime | None:
    if schedule.kind == "once":
        run_at = schedule.run_at
        return whole_seconds(run_at) if run_at is not None and whole_seconds(run_at) > after else None
    trigger = _trigger(schedule)
    if trigger is None:
        return None
    found = trigger.get_next_fire_time(None, (after + _TICK).astimezone(UTC))
    if found is None:
        return None
    # Triggers work in float timestamps: round to the nearest second, so that a
    # value a hair under a whole second is not cut down to the one before.
    return whole_seconds(found + timedelta(milliseconds=500))


def _quiet(schedule: Schedule) -> tuple[time, time] | None:
    if not schedule.quiet_start or not schedule.quiet_end:
        return None
    start, end = parse_clock(schedule.quiet_start), parse_clock(schedule.quiet_end)
    return None if start == end else (start, end)


def in_quiet_hours(schedule: Schedule, moment: datetime) -> bool:
    window = _quiet(schedule)
    if window is None:
        return False
    start, end = window
    clock = moment.astimezone(zone(schedule.timezone)).time()
    return start <= clock < end if start < end else (clock >= start or clock < end)


def _quiet_end(schedule: Schedule, moment: datetime) -> datetime:
    """The first allowed moment after `moment`, which is inside quiet hours."""
    start, end = _quiet(schedule) or (time(0), time(0))
    tz = zone(schedule.timezone)
    local = moment.astimezone(tz)
    day = local.date() + timedelta(days=1) if start > end and local.time() >= start else local.date()
    return whole_seconds(_local(day, end, tz))


def next_fire(schedule: Schedule, after: datetime) -> datetime | None:
    """The first fire time strictly after `after`; one that falls in quiet hours
    moves to the end of them. None when a reminder has nothing left."""
    found = _raw_next(schedule, after)
    if found is not None and in_quiet_hours(schedule, found):
        found = _quiet_end(schedule, found)
    return found


def backoff_skips(unanswered: int, settings: CheckinSettings) -> int:
    """Occurrences to skip after `unanswered` consecutive unanswered ticks:
    none before the threshold, then 1, 2, 4, 8... (capped by max_backoff_days)."""
    if settings.backoff_after <= 0 or unanswered < settings.backoff_after:
        return 0
    return int(min(2 ** min(unanswered - settings.backoff_after, 20), _MAX_STEPS))


def next_fire_with_backoff(
    schedule: Schedule, after: datetime, unanswered: int, settings: CheckinSettings
) -> datetime | None:
    first = next_fire(schedule, after)
    if first is None or schedule.kind == "once":
        return first
    limit = after + timedelta(days=settings.max_backoff_days)
    chosen = first
    for _ in range(backoff_skips(unanswered, settings)):
        candidate = next_fire(schedule, chosen)
        if candidate is None or candidate > limit:
            break
        chosen = candidate
    return chosen


# -- words -------------------------------------------------------------------
def format_local(moment: datetime, tz_name: str | None, *, with_zone: bool = True) -> str:
    """ "Mon 30 Nov 09:00 Europe/Paris"."""
    local = moment.astimezone(zone(tz_name))
    text = f"{local:%a} {local.day} {local:%b %H:%M}"
    return f"{text} {tz_name or 'UTC'}" if with_zone else text


def humanize(delta: timedelta) -> str:
    """To the nearest unit: a reminder set "in 2 hours" is 1:59:59 away a moment
    later, and must still read "2 hours", not "1 hour"."""
    seconds = max(0, round(delta.total_seconds()))
    if seconds < 60:
        return "less than a minute"
    if (minutes := (seconds + 30) // 60) < 60:
        return plural(minutes, "minute")
    if (hours := (seconds + 1800) // 3600) < 48:
        return plural(hours, "hour")
    return plural((seconds + 43200) // 86400, "day")


def describe(schedule: Schedule) -> str:
    """ "daily at 09:00", "weekly on Monday at 18:30", "every 4 hours", "reminder: call Mum"."""
    if schedule.kind == "daily":
        return f"daily at {schedule.time_of_day}"
    if schedule.kind == "weekly":
        return f"weekly on {WEEKDAYS[schedule.weekday or 0].capitalize()} at {schedule.time_of_day}"
    if schedule.kind == "interval":
        return f"every {plural(schedule.every_hours or 1, 'hour')}"
    return f"reminder: {schedule.note}" if schedule.note else "reminder"


def tick_reason(schedule: Schedule) -> str:
    """The reason line the agent reads when the tick wakes it."""
    if schedule.kind == "once":
        return f"Reminder they asked for (or you promised): {schedule.note or 'no note'}"
    reason = f"Check-in the person asked for ({describe(schedule)})"
    if schedule.note:
        reason += f", about: {schedule.note}"
    if schedule.unanswered:
        reason += f". They have not answered your last {plural(schedule.unanswered, 'check-in')}"
    return reason
