"""`memgpt-bot limits show|exempt|unexempt|reset USER`: the admin's side of the
per-user message rate and daily token budget (bot/limits.py).

Registered by cli/main.py with `add_limits_commands(commands, common)`. Works on
the store directly (no LLM key, no embedding model), so it acts on a running
bot at once: every process reads exemptions and counters from the store.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

from bot.config import Settings
from bot.limits import Usage, UsageLimits, humanize_wait
from cli.args import User, user_argument
from cli.common import EXIT_OK, write
from memory.store import Store
from memory.types import utc_now


def add_limits_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser | None = None,
) -> None:
    """`common` carries the global options, so they work after the subcommand too."""
    parents = [common] if common is not None else []
    limits = commands.add_parser(
        "limits",
        parents=parents,
        help="per-user message rate and daily token budget: show, exempt, reset",
        description="USER is a terminal user's name or PLATFORM:ID (discord:1234, slack:T01:U02).",
    )
    actions = limits.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show", parents=parents, help="a user's usage against the limits; without USER, every exempt user"
    )
    show.add_argument("user", nargs="?", type=user_argument, metavar="USER")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_limits_show)
    for name, func, text in (
        ("exempt", cmd_limits_exempt, "exempt USER from both limits (MEMGPT_UNLIMITED_USERS does it by setting)"),
        ("unexempt", cmd_limits_unexempt, "undo `limits exempt USER`"),
        ("reset", cmd_limits_reset, "clear USER's counters: they may write and spend from zero again today"),
    ):
        action = actions.add_parser(name, parents=parents, help=text)
        action.add_argument("user", type=user_argument, metavar="USER")
        action.set_defaults(func=func)


async def _with_limits(settings: Settings, work: Callable[[UsageLimits], Awaitable[int]]) -> int:
    from bot.runtime import default_store  # here so `--help` stays fast

    store: Store = default_store(settings)
    await store.open()
    try:
        return await work(UsageLimits(store, settings))
    finally:
        await store.close()


async def cmd_limits_show(args: argparse.Namespace, settings: Settings) -> int:
    user: User | None = args.user

    async def work(limits: UsageLimits) -> int:
        if user is None:
            by_admin = await limits.store.list_usage_exempt()
            if args.json:
                write(json.dumps({"exempt_by_admin": by_admin, "exempt_by_env": sorted(limits.unlimited)}, indent=2))
            else:
                write(render_exemptions(by_admin, sorted(limits.unlimited)))
            return EXIT_OK
        usage = await limits.usage(user.key)
        write(json.dumps(usage_json(usage), indent=2) if args.json else render_usage(usage))
        return EXIT_OK

    return await _with_limits(settings, work)


async def cmd_limits_exempt(args: argparse.Namespace, settings: Settings) -> int:
    return await _set_exempt(args.user, settings, True)


async def cmd_limits_unexempt(args: argparse.Namespace, settings: Settings) -> int:
    return await _set_exempt(args.user, settings, False)


async def _set_exempt(user: User, settings: Settings, exempt: bool) -> int:
    async def work(limits: UsageLimits) -> int:
        changed = await limits.set_exempt(user.key, exempt)
        if exempt:
            text = f"{user.key} is now exempt from the limits." if changed else f"{user.key} was exempt already."
        else:
            text = f"{user.key} is no longer exempt." if changed else f"{user.key} was not exempted by `limits exempt`."
            if user.key in limits.unlimited:
                text += " It stays exempt through MEMGPT_UNLIMITED_USERS."
        write(text)
        return EXIT_OK

    return await _with_limits(settings, work)


async def cmd_limits_reset(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user

    async def work(limits: UsageLimits) -> int:
        removed = await limits.reset(user.key)
        write(f"Reset the counters of {user.key} ({removed} cleared): they may write and spend from zero again.")
        return EXIT_OK

    return await _with_limits(settings, work)


def _limit(value: int) -> str:
    return f"{value:,}" if value else "no limit"


def render_usage(usage: Usage) -> str:
    if usage.exempt:
        how = " and ".join(
            where
            for where, yes in (
                ("limits exempt", usage.exempt_by_admin),
                ("MEMGPT_UNLIMITED_USERS", usage.exempt_by_env),
            )
            if yes
        )
        exempt = f"yes (by {how})"
    else:
        exempt = "no"
    resets = humanize_wait(usage.budget_resets_at - utc_now())
    return "\n".join(
        [
            usage.key,
            f"  messages let through in the last minute: {usage.messages_last_minute} "
            f"(limit {_limit(usage.rate_limit)})",
            f"  tokens today (UTC): {usage.tokens_today:,} (budget {_limit(usage.daily_budget)}; "
            f"resets at midnight UTC, in {resets})",
            f"  exempt: {exempt}",
            "  LLM tokens per UTC day (counted locally; cached: what the server said it served from its cache):",
            *(
                f"    {day.day:%Y-%m-%d}: prompt {day.prompt:,} (cached {day.cached:,}), completion "
                f"{day.completion:,}; charged to the budget {day.charged:,}"
                for day in usage.days
            ),
        ]
    )


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "user": usage.key,
        "messages_last_minute": usage.messages_last_minute,
        "rate_limit_per_minute": usage.rate_limit,
        "tokens_today": usage.tokens_today,
        "daily_token_budget": usage.daily_budget,
        "budget_resets_at": usage.budget_resets_at.isoformat(),
        "exempt": usage.exempt,
        "exempt_by_admin": usage.exempt_by_admin,
        "exempt_by_env": usage.exempt_by_env,
        "tokens_by_day": [
            {
                "day": f"{day.day:%Y-%m-%d}",
                "prompt": day.prompt,
                "cached": day.cached,
                "completion": day.completion,
                "charged": day.charged,
            }
            for day in usage.days
        ],
    }


def render_exemptions(by_admin: list[str], by_env: list[str]) -> str:
    if not by_admin and not by_env:
        return "No user is exempt from the limits."
    lines = [f"{key}  (limits exempt)" for key in by_admin]
    lines += [f"{key}  (MEMGPT_UNLIMITED_USERS)" for key in by_env]
    return "\n".join(lines)
