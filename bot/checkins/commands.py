"""The platform-neutral `/checkin` command: text in, a short answer out.

Both adapters pass the text after `/checkin` and where the command came from
(`reply_to`, usually the DM), which is where the check-ins will be delivered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, time
from functools import partial

from bot.checkins.rules import (
    Schedule,
    describe,
    format_local,
    hhmm,
    next_fire,
    parse_clock,
    parse_timezone,
    parse_weekday,
)
from bot.events import agent_key
from bot.reports import plural
from bot.settings import CheckinSettings
from memory.schedules import CheckinPrefs, ScheduleKind, ScheduleStore

Clock = Callable[[], datetime]
OnChange = Callable[[], Awaitable[None]]

HELP = """\
Check-ins: I message you first, at times you choose (I may stay quiet if there's nothing worth saying).
• `/checkin daily 09:00 [note]`: every day at 09:00
• `/checkin weekly mon 18:30 [note]`: every Monday at 18:30
• `/checkin every 4h [note]`: every 4 hours (at least 1)
• `/checkin tz Europe/Paris`: your time zone (times above are in it)
• `/checkin quiet 22:00-07:00` or `/checkin quiet off`: hours I never message you
• `/checkin list`: your check-ins and reminders, with their next times
• `/checkin pause [ID|all]`, `/checkin resume [ID|all]`, `/checkin remove ID|all`"""


class _Usage(Exception):
    """Bad input: the message says what was wrong, with an example."""


async def checkin_command(
    platform: str,
    user_id: str,
    text: str,
    reply_to: dict[str, object],
    store: ScheduleStore,
    clock: Clock,
    *,
    settings: CheckinSettings | None = None,
    on_change: OnChange | None = None,
) -> str:
    """Run one `/checkin ...` command for this user; the answer to show them.
    `on_change` (e.g. the scheduler's resync) runs after any change."""
    command = _Command(platform, user_id, dict(reply_to), store, clock, settings or CheckinSettings())
    words = text.split()
    verb = words[0].lower() if words else "help"
    handler = command.handlers().get(verb)
    if handler is None:
        return f"I don't know `/checkin {verb}`. Try `/checkin daily 09:00`, or `/checkin help` for everything."
    try:
        answer = await handler(words[1:])
    except _Usage as usage:
        return str(usage)
    if command.changed and on_change is not None:
        await on_change()
    return answer


class _Command:
    def __init__(
        self,
        platform: str,
        user_id: str,
        reply_to: dict[str, object],
        store: ScheduleStore,
        clock: Clock,
        settings: CheckinSettings,
    ) -> None:
        self.platform = platform
        self.user_id = user_id
        self.key = agent_key(platform, user_id)
        self.reply_to = reply_to
        self.store = store
        self.clock = clock
        self.settings = settings
        self.changed = False

    def handlers(self) -> dict[str, Callable[[list[str]], Awaitable[str]]]:
        return {
            "help": self.help,
            "daily": self.daily,
            "weekly": self.weekly,
            "every": self.every,
            "tz": self.timezone,
            "timezone": self.timezone,
            "quiet": self.quiet,
            "list": self.list_schedules,
            "pause": partial(self._set_paused, paused=True),
            "resume": partial(self._set_paused, paused=False),
            "remove": self.remove,
            "delete": self.remove,
        }

    async def help(self, args: list[str]) -> str:
        return HELP

    # -- new check-ins ---------------------------------------------------------
    async def daily(self, args: list[str]) -> str:
        if not args:
            raise _Usage("Which time? For example: `/checkin daily 09:00`")
        clock = _clock(args[0], "`/checkin daily 09:00`")
        return await self._add("daily", " ".join(args[1:]), time_of_day=hhmm(clock))

    async def weekly(self, args: list[str]) -> str:
        example = "`/checkin weekly mon 18:30`"
        if len(args) < 2:
            raise _Usage(f"Which day and time? For example: {example}")
        try:
            weekday = parse_weekday(args[0])
        except ValueError as error:
            raise _Usage(f"{_sentence(error)} For example: {example}") from None
        clock = _clock(args[1], example)
        return await self._add("weekly", " ".join(args[2:]), time_of_day=hhmm(clock), weekday=weekday)

    async def every(self, args: list[str]) -> str:
        example = "`/checkin every 4h`"
        if not args:
            raise _Usage(f"Every how many hours? For example: {example}")
        amount, rest = args[0].lower(), args[1:]
        if rest and rest[0].lower() in ("h", "hr", "hrs", "hour", "hours"):
            rest = rest[1:]
        amount = amount.removesuffix("hours").removesuffix("hour").removesuffix("hrs").removesuffix("h")
        if not amount.isdigit():
            raise _Usage(f"{args[0]!r} is not a number of hours. For example: {example}")
        hours = int(amount)
        if not 1 <= hours <= 168:
            raise _Usage(f"Between 1 and 168 hours (a week), please. For example: {example}")
        return await self._add("interval", " ".join(rest), every_hours=hours)

    async def _add(
        self,
        kind: ScheduleKind,
        note: str,
        *,
        time_of_day: str | None = None,
        weekday: int | None = None,
        every_hours: int | None = None,
    ) -> str:
        existing = await self.store.list_for_user(self.key)
        recurring = [s for s in existing if s.kind != "once"]
        for other in recurring:
            if (other.kind, other.time_of_day, other.weekday, other.every_hours) == (
                kind,
                time_of_day,
                weekday,
                every_hours,
            ):
                return f"You already have that one: {other.id}, {describe(other)}. `/checkin list` shows them all."
        if len(recurring) >= self.settings.max_checkins:
            raise _Usage(
                f"You have {len(recurring)} check-ins, the most I keep. Remove one first: `/checkin remove ID`."
            )
        prefs = await self.store.get_prefs(self.key)
        now = self.clock()
        schedule = Schedule(
            id="",
            agent_key=self.key,
            platform=self.platform,
            user_id=self.user_id,
            kind=kind,
            timezone=prefs.timezone or "UTC",
            time_of_day=time_of_day,
            weekday=weekday,
            every_hours=every_hours,
            quiet_start=prefs.quiet_start,
            quiet_end=prefs.quiet_end,
            note=note.strip()[:300],
            reply_to=self.reply_to,
            created_at=now,
        )
        schedule.next_fire_at = next_fire(schedule, now)
        await self.store.add(schedule)
        self.changed = True
        answer = f"Done: check-in {schedule.id}, {describe(schedule)}"
        if schedule.next_fire_at:
            answer += f". Next: {format_local(schedule.next_fire_at, schedule.timezone)}."
        if not prefs.timezone and kind != "interval":
            answer += " Times are UTC until you set your zone, e.g. `/checkin tz Europe/Paris`."
        return answer

    # -- preferences -------------------------------------------------------------
    async def timezone(self, args: list[str]) -> str:
        prefs = await self.store.get_prefs(self.key)
        if not args:
            return f"Your time zone is {prefs.timezone or 'UTC (not set)'}. Change it: `/checkin tz Europe/Paris`."
        try:
            name = parse_timezone(args[0])
        except ValueError as error:
            raise _Usage(f"{_sentence(error)} For example: `/checkin tz Europe/Paris`") from None
        prefs.timezone = name
        count = await self._apply(prefs)
        moved = f" {plural(count, 'check-in')} now {'follows' if count == 1 else 'follow'} it." if count else ""
        return f"Time zone set to {name} (it is {format_local(self.clock(), name)}).{moved}"

    async def quiet(self, args: list[str]) -> str:
        prefs = await self.store.get_prefs(self.key)
        example = "`/checkin quiet 22:00-07:00` or `/checkin quiet off`"
        if not args:
            if prefs.quiet_start and prefs.quiet_end:
                return f"Quiet hours: {prefs.quiet_start}-{prefs.quiet_end} ({prefs.timezone or 'UTC'})."
            return f"No quiet hours set. Set them: {example}"
        spec = "".join(args).lower()
        if spec in ("off", "none", "clear"):
            prefs.quiet_start = prefs.quiet_end = None
            await self._apply(prefs)
            return "Quiet hours off."
        start_text, dash, end_text = spec.replace("–", "-").partition("-")
        if not dash:
            raise _Usage(f"Give a start and an end: {example}")
        start, end = _clock(start_text, example), _clock(end_text, example)
        if start == end:
            raise _Usage(f"Start and end are the same time. For example: {example}")
        prefs.quiet_start, prefs.quiet_end = hhmm(start), hhmm(end)
        await self._apply(prefs)
        return (
            f"Quiet hours set: {prefs.quiet_start}-{prefs.quiet_end} ({prefs.timezone or 'UTC'}). "
            "A check-in that falls in them comes when they end."
        )

    async def _apply(self, prefs: CheckinPrefs) -> int:
        """Save prefs and carry them into every schedule; how many were updated."""
        await self.store.save_prefs(prefs)
        self.changed = True
        now = self.clock()
        schedules = await self.store.list_for_user(self.key)
        for schedule in schedules:
            schedule.timezone = prefs.timezone or "UTC"
            schedule.quiet_start, schedule.quiet_end = prefs.quiet_start, prefs.quiet_end
            if not schedule.paused:
                schedule.next_fire_at = next_fire(schedule, now)
            await self.store.update(schedule)
        return len(schedules)

    # -- the user's schedules ------------------------------------------------------
    async def list_schedules(self, args: list[str]) -> str:
        schedules = await self.store.list_for_user(self.key)
        prefs = await self.store.get_prefs(self.key)
        if not schedules:
            return "No check-ins yet. Start one: `/checkin daily 09:00` (`/checkin help` for more)."
        quiet = f", quiet {prefs.quiet_start}-{prefs.quiet_end}" if prefs.quiet_start else ""
        lines = [f"Your check-ins (zone {prefs.timezone or 'UTC'}{quiet}):"]
        for schedule in schedules:
            if schedule.paused:
                when = "paused"
            elif schedule.next_fire_at:
                when = f"next {format_local(schedule.next_fire_at, schedule.timezone, with_zone=False)}"
            else:
                when = "done"
            note = f" ({schedule.note})" if schedule.note and schedule.kind != "once" else ""
            lines.append(f"• `{schedule.id}` {describe(schedule)}{note}: {when}")
        return "\n".join(lines)

    async def _set_paused(self, args: list[str], *, paused: bool) -> str:
        verb = "pause" if paused else "resume"
        chosen = await self._chosen(args, verb, default_all=True)
        now = self.clock()
        for schedule in chosen:
            schedule.paused = paused
            # Resuming starts from now: what fell due while paused never fires.
            schedule.next_fire_at = schedule.next_fire_at if paused else next_fire(schedule, now)
            if not paused and schedule.kind == "once" and schedule.next_fire_at is None:
                await self.store.delete(schedule.id)
            else:
                await self.store.update(schedule)
        self.changed = True
        names = ", ".join(schedule.id for schedule in chosen)
        return f"{'Paused' if paused else 'Resumed'}: {names}."

    async def remove(self, args: list[str]) -> str:
        if not args:
            raise _Usage("Which one? `/checkin remove ID` (IDs are in `/checkin list`), or `/checkin remove all`.")
        chosen = await self._chosen(args, "remove", default_all=False)
        for schedule in chosen:
            await self.store.delete(schedule.id)
        self.changed = True
        return f"Removed: {', '.join(schedule.id for schedule in chosen)}."

    async def _chosen(self, args: list[str], verb: str, *, default_all: bool) -> list[Schedule]:
        """The user's schedules named by `args` (an id, or all); only ever theirs."""
        schedules = await self.store.list_for_user(self.key)
        if not schedules:
            raise _Usage("You have no check-ins. Start one: `/checkin daily 09:00`.")
        wanted = args[0].lower().lstrip("#") if args else ("all" if default_all else "")
        if wanted == "all":
            return schedules
        chosen = [schedule for schedule in schedules if schedule.id == wanted]
        if not chosen:
            ids = ", ".join(schedule.id for schedule in schedules)
            raise _Usage(f"You have no check-in {args[0]!r}; yours: {ids}. For example: `/checkin {verb} {ids[:6]}`")
        return chosen


def _clock(text: str, example: str) -> time:
    try:
        return parse_clock(text)
    except ValueError as error:
        raise _Usage(f"{_sentence(error)} For example: {example}") from None


def _sentence(error: ValueError) -> str:
    text = str(error).rstrip(".")
    return text[:1].upper() + text[1:] + "."
