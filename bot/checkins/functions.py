"""`schedule_reminder`: the agent's own way to reach out later.

Like every function it takes no user id: the reminder belongs to the calling
agent's user, and is delivered where the event being handled came from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from bot.checkins.rules import (
    Schedule,
    format_local,
    humanize,
    in_quiet_hours,
    next_fire,
    parse_when,
)
from bot.functions.registry import HEARTBEAT, FunctionError, FunctionSet, function_schema
from bot.settings import CheckinSettings
from memory.schedules import ScheduleStore
from memory.types import utc_now

if TYPE_CHECKING:
    from bot.agent import Agent

MAX_NOTE_CHARS = 500
OnChange = Callable[[], Awaitable[None]]

SCHEDULE_REMINDER = function_schema(
    "schedule_reminder",
    "Wake once later (a scheduled tick with the note) to follow up or remind.",
    {
        "when": {"type": "string", "description": "ISO time, 'in 2 hours' or 'tomorrow 09:00'; no zone: theirs."},
        "note": {"type": "string"},
        "request_heartbeat": HEARTBEAT,
    },
    ["when", "note", "request_heartbeat"],
)


def _sender(agent: Agent) -> tuple[str, str, dict[str, Any]]:
    """Who a reminder is for and where it goes: always their DM. Its tick wakes
    the agent in the DM, with everything it knows, so its answer must reach
    the person alone, even when they asked for it in a channel."""
    event = getattr(agent, "current_event", None)
    if event is not None:
        if event.place.is_dm:
            return event.platform, event.user_id, dict(event.reply_to)
        if not event.dm_reply_to:
            raise FunctionError(
                "A reminder is delivered by direct message, and there is no way to reach this person's DMs "
                "from here: ask them to set it in a direct message with you."
            )
        return event.platform, event.user_id, dict(event.dm_reply_to)
    platform, _, user_id = agent.record.key.partition(":")
    return platform, user_id, {}


def register_checkin_functions(
    functions: FunctionSet[Agent],
    schedules: ScheduleStore,
    settings: CheckinSettings | None = None,
    clock: Callable[[], datetime] = utc_now,
    on_change: OnChange | None = None,
) -> None:
    """Add schedule_reminder to `functions`. Call it before the runtime loads
    its first agent: each agent's queue manager counts the schemas once."""
    settings = settings or CheckinSettings()

    async def schedule_reminder(agent: Agent, args: dict[str, Any]) -> str:
        note = " ".join(args["note"].split())
        if not note:
            raise FunctionError("note is empty; say what the reminder is about.")
        if len(note) > MAX_NOTE_CHARS:
            raise FunctionError(f"note is {len(note)} characters; keep it under {MAX_NOTE_CHARS}.")
        key = agent.record.key
        prefs = await schedules.get_prefs(key)
        zone_name = prefs.timezone or "UTC"
        now = clock()
        try:
            when = parse_when(args["when"], now, zone_name)
        except ValueError as error:
            raise FunctionError(f"when: {error}.") from None
        if when <= now:
            raise FunctionError(
                f"{format_local(when, zone_name)} is in the past; it is now {format_local(now, zone_name)}."
            )
        soonest = timedelta(minutes=settings.min_reminder_minutes)
        if when - now < soonest:
            raise FunctionError(
                f"{format_local(when, zone_name)} is too soon: a reminder must be at least "
                f"{humanize(soonest)} from now ({format_local(now, zone_name)})."
            )
        pending = [s for s in await schedules.list_for_user(key) if s.kind == "once"]
        if len(pending) >= settings.max_reminders:
            raise FunctionError(
                f"the person already has {len(pending)} pending reminders, the most allowed; "
                "tell them, or wait until one has fired."
            )
        platform, user_id, reply_to = _sender(agent)
        reminder = Schedule(
            id="",
            agent_key=key,
            platform=platform,
            user_id=user_id,
            kind="once",
            timezone=zone_name,
            run_at=when,
            quiet_start=prefs.quiet_start,
            quiet_end=prefs.quiet_end,
            note=note,
            reply_to=reply_to,
            created_at=now,
        )
        reminder.next_fire_at = next_fire(reminder, now)
        await schedules.add(reminder)
        if on_change is not None:
            await on_change()
        fire_at = reminder.next_fire_at or when
        text = (
            f"Reminder {reminder.id} set for {format_local(fire_at, zone_name)} "
            f"(in {humanize(fire_at - now)}); you will be woken then with the note."
        )
        if in_quiet_hours(reminder, when):
            text += f" {format_local(when, zone_name, with_zone=False)} is in their quiet hours, so it is moved."
        return text

    functions.register(SCHEDULE_REMINDER, schedule_reminder, on_demand="wake later to follow up")
