"""`memgpt-bot run`: the bot on Discord and/or Slack, with scheduled check-ins."""

from __future__ import annotations

import argparse
import sys

from bot.config import Settings
from cli.common import open_runtime


def add_run_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    run = commands.add_parser(
        "run",
        parents=[common],
        help="run the bot on every configured platform (Discord, Slack)",
        description="Start every adapter whose credentials are configured (DISCORD_TOKEN; SLACK_BOT_TOKEN with "
        "SLACK_APP_TOKEN for Socket Mode or SLACK_SIGNING_SECRET for HTTP mode), sharing one runtime, "
        "and the scheduler for check-ins. Stops on Ctrl-C or SIGTERM.",
    )
    run.set_defaults(func=cmd_run)


async def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from cli.app import serve

    def announce(line: str) -> None:
        print(f"memgpt-bot: {line}", file=sys.stderr, flush=True)

    async with open_runtime(settings, talks_to_llm=True, warm_up=settings.warm_up) as runtime:
        await serve(runtime, announce)
    return 0
