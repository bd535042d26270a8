"""`memgpt-bot checkins list`: every scheduled check-in and reminder, for the admin.

Registered by cli/main.py with `add_checkin_commands(commands, common)`.
Reads the store directly: no LLM key and no embedding model needed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bot.checkins.rules import describe, format_local
from bot.config import Settings
from cli.common import EXIT_OK, dumps, iso, write
from memory.schedules import Schedule


def add_checkin_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser | None = None,
) -> None:
    """`common` carries the global options, so they work after the subcommand too."""
    parents = [common] if common is not None else []
    checkins = commands.add_parser(
        "checkins", parents=parents, help="scheduled check-ins and reminders (see docs/checkins.md)"
    )
    actions = checkins.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", parents=parents, help="every schedule with its user, zone, next fire time and state"
    )
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_checkins_list)


async def cmd_checkins_list(args: argparse.Namespace, settings: Settings) -> int:
    from bot.runtime import default_store  # here so `--help` stays fast

    store = default_store(settings)
    await store.open()
    try:
        schedules = await store.schedules.list_all()
    finally:
        await store.close()
    write(dumps([_json(s) for s in schedules], indent=2) if args.json else render_schedules(schedules))
    return EXIT_OK


def _json(schedule: Schedule) -> dict[str, Any]:
    return {
        "id": schedule.id,
        "user": schedule.agent_key,
        "kind": schedule.kind,
        "what": describe(schedule),
        "timezone": schedule.timezone,
        "quiet_hours": f"{schedule.quiet_start}-{schedule.quiet_end}" if schedule.quiet_start else None,
        "paused": schedule.paused,
        "next_fire_at": iso(schedule.next_fire_at),
        "unanswered": schedule.unanswered,
        "last_fired_at": iso(schedule.last_fired_at),
        "created_at": iso(schedule.created_at),
        "reply_to": schedule.reply_to,
    }


def render_schedules(schedules: Sequence[Schedule]) -> str:
    if not schedules:
        return "No check-ins or reminders scheduled."
    rows = [("ID", "USER", "WHAT", "ZONE", "NEXT (UTC)", "NEXT (LOCAL)", "STATE")]
    for s in schedules:
        nxt = s.next_fire_at
        state = "paused" if s.paused else (f"{s.unanswered} unanswered" if s.unanswered else "active")
        rows.append(
            (
                s.id,
                s.agent_key,
                describe(s)[:40],
                s.timezone,
                nxt.strftime("%Y-%m-%d %H:%M") if nxt else "-",
                format_local(nxt, s.timezone, with_zone=False) if nxt else "-",
                state,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)
