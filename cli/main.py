"""The `memgpt-bot` command line: the parser, settings, logging and the one
place that turns every failure into one line.

    memgpt-bot [--data-dir PATH] [--env-file PATH] [-v] chat --user NAME
    memgpt-bot memory show   --user NAME [--page N] [--json]
    memgpt-bot memory search --user NAME (--recall QUERY | --archival QUERY) [--limit K] [--place P] [--json]
    memgpt-bot memory export --user NAME
    memgpt-bot memory forget --user NAME [--about WORDS | --item ID] [--yes]
    memgpt-bot memory import --user NAME FILE
    memgpt-bot limits show|exempt|unexempt|reset USER
    memgpt-bot --version

`--user` is a bare name (a terminal user) or PLATFORM:ID (`discord:1234`,
`slack:T01:U02`). Global options may come before or after the subcommand.

Standard output carries only results (chat replies, search answers, JSON);
logs go to standard error (warnings, or everything with -v) and to
`<data dir>/memgpt-bot.log`. Errors are one line on standard error and a
non-zero exit status, never a traceback. The commands live in their own
modules (cli/memory.py, cli/history.py, cli/run.py, ...), which import
cli/common.py and never this file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from importlib import metadata
from pathlib import Path
from typing import Any

from bot.config import Settings
from bot.errors import ConfigError
from bot.llm import LLMUnavailableError
from cli.app import NoAdapterError
from cli.args import User, user_argument
from cli.checkins import add_checkin_commands
from cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, PROG, CLIError, fail, isatty, open_runtime
from cli.documents import add_document_commands
from cli.history import add_import_command
from cli.limits import add_limits_commands
from cli.logs import configure_logging
from cli.memory import add_memory_commands
from cli.migrate import add_migrate_command
from cli.run import add_run_command
from memory.store import StoreError

log = logging.getLogger("memgpt_bot.cli")


def version() -> str:
    try:
        return metadata.version("memgpt-bot")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The same options on the main parser (with defaults) and on every
    subcommand (without, so they never overwrite one given earlier)."""
    keep = {} if defaults else {"default": argparse.SUPPRESS}
    parser.add_argument(
        "--data-dir",
        metavar="PATH",
        help="where memory is kept (overrides MEMGPT_DATA_DIR)",
        **({"default": None} if defaults else keep),
    )
    parser.add_argument(
        "--env-file",
        metavar="PATH",
        help="settings file to read (default: .env in the current folder)",
        **({"default": None} if defaults else keep),
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log progress to standard error",
        **({"default": False} if defaults else keep),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="A MemGPT chat bot: one persistent, self-managing memory agent per user."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    _global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, defaults=False)
    user = argparse.ArgumentParser(add_help=False)
    user.add_argument(
        "--user",
        required=True,
        type=user_argument,
        metavar="NAME",
        help="a terminal user's name, or PLATFORM:ID (discord:1234, slack:T01:U02)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    chat = commands.add_parser(
        "chat",
        parents=[common, user],
        help="chat with your agent: lines in, replies out",
        description="Read messages from standard input, one a line; print each reply on its own line. "
        "The embedding model loads in the background meanwhile, so the first search rarely waits.",
    )
    chat.set_defaults(func=cmd_chat)

    memory = commands.add_parser("memory", parents=[common], help="inspect or manage what the bot holds on a user")
    actions = memory.add_subparsers(dest="action", metavar="ACTION", required=True)
    add_memory_commands(actions, [common, user])
    add_import_command(actions, [common, user])
    add_document_commands(commands, common)
    add_checkin_commands(commands, common)
    add_limits_commands(commands, common)
    add_run_command(commands, common)
    add_migrate_command(commands, [common])
    return parser


# -- entry points ------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    raise SystemExit(run(argv))


def run(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version, usage errors
        return exit_.code if isinstance(exit_.code, int) else (EXIT_OK if exit_.code is None else EXIT_USAGE)
    command = " ".join(part for part in (args.command, getattr(args, "action", None)) if part)
    log_file: Path | None = None
    try:
        settings = load_settings(args)
        log_file = configure_logging(settings, verbose=args.verbose, counts_tokens=args.command in ("chat", "run"))
        log.info("%s %s %s: settings %s", PROG, version(), command, settings.redacted())
        func: Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]] = args.func
        code = asyncio.run(func(args, settings))
        log.info("%s %s: exit %d", PROG, command, code)
        return code
    except (CLIError, ConfigError, StoreError, LLMUnavailableError, NoAdapterError) as error:
        return fail(str(error))
    except KeyboardInterrupt:
        if isatty(sys.stderr):
            sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (`| head`): stop quietly.
        _silence_stdout()
        return EXIT_ERROR
    except Exception as error:
        where = ""
        if log_file:  # before logging is set up, Python's last-resort handler would print the traceback
            log.exception("%s %s: unexpected error", PROG, command, extra={"file_only": True})
            where = f" (details in {log_file})"
        return fail(f"unexpected {type(error).__name__}: {error}{where}")


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def load_settings(args: argparse.Namespace) -> Settings:
    env_file: str | None = args.env_file
    if env_file is not None and not Path(env_file).is_file():
        raise CLIError(f"settings file {env_file} does not exist")
    settings = Settings.from_env(env_file or ".env")
    if args.data_dir:
        settings.data_dir = Path(args.data_dir).expanduser()
    return settings


# -- chat --------------------------------------------------------------------
async def cmd_chat(args: argparse.Namespace, settings: Settings) -> int:
    from adapters.terminal import TerminalChat

    user: User = args.user
    # At a terminal a person may ask for a search soon: load the model meanwhile.
    async with open_runtime(settings, talks_to_llm=True, warm_up=settings.warm_up and isatty(sys.stdin)) as runtime:
        sent = await TerminalChat(runtime, user.user_id, platform=user.platform).run()
        log.info("chat with %s ended: %d messages", user.key, sent)
    return EXIT_OK


if __name__ == "__main__":
    main()
