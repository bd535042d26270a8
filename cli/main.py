"""The `memgpt-bot` command line.

    memgpt-bot [--data-dir PATH] [--env-file PATH] [-v] chat --user NAME
    memgpt-bot memory show   --user NAME [--json]
    memgpt-bot memory search --user NAME (--recall QUERY | --archival QUERY) [--limit K] [--json]
    memgpt-bot memory export --user NAME
    memgpt-bot memory forget --user NAME [--yes]
    memgpt-bot memory import --user NAME FILE.jsonl
    memgpt-bot limits show|exempt|unexempt|reset USER
    memgpt-bot --version

`--user` is a bare name (a terminal user) or PLATFORM:ID (`discord:1234`,
`slack:T01:U02`). Global options may come before or after the subcommand.

Standard output carries only results (chat replies, search answers, JSON);
logs go to standard error (warnings, or everything with -v) and to
`<data dir>/memgpt-bot.log`. Errors are one line on standard error and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from contextlib import aclosing
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from bot.config import ConfigError, Settings
from bot.llm import LLMUnavailableError
from bot.reports import plural, render_description
from cli.app import NoAdapterError
from cli.args import User, user_argument
from cli.checkins import add_checkin_commands
from cli.documents import add_document_commands
from cli.limits import add_limits_commands
from cli.migrate import add_migrate_command
from cli.run import add_run_command
from memory.store import StoreError
from memory.types import Message, Passage

if TYPE_CHECKING:
    from bot.reports import plural, render_description
from bot.runtime import Runtime

log = logging.getLogger("memgpt_bot.cli")

PROG = "memgpt-bot"
LOG_FILE = "memgpt-bot.log"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
IMPORT_ROLES = ("user", "assistant", "system")
NO_API_KEY = (
    "OPENAI_API_KEY is not set: chat needs it. Set it in the environment or in .env "
    "(e.g. OPENAI_API_KEY=sk-...); local OpenAI-compatible servers (Ollama, llama.cpp, vLLM) "
    "accept any value, e.g. OPENAI_API_KEY=local with OPENAI_BASE_URL pointing at them"
)


class CLIError(Exception):
    """A failure to report as one line on standard error."""


# -- arguments ---------------------------------------------------------------
def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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
        description="Read messages from standard input, one a line; print each reply on its own line.",
    )
    chat.set_defaults(func=cmd_chat)

    memory = commands.add_parser("memory", parents=[common], help="inspect or manage what the bot holds on a user")
    actions = memory.add_subparsers(dest="action", metavar="ACTION", required=True)

    show = actions.add_parser("show", parents=[common, user], help="working context, summary and counts")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_show)

    search = actions.add_parser(
        "search",
        parents=[common, user],
        help="search recall or archival storage",
        description="Search recall storage (words) or archival storage (meaning). With '-' as the query, "
        "queries are read one a line from standard input and answered as JSON lines, in order.",
    )
    where = search.add_mutually_exclusive_group(required=True)
    where.add_argument("--recall", metavar="QUERY", help="search every past message by words")
    where.add_argument("--archival", metavar="QUERY", help="search saved passages by meaning")
    search.add_argument("--limit", type=_positive, default=10, metavar="K", help="results per query (default 10)")
    search.add_argument("--json", action="store_true", help="print JSON")
    search.set_defaults(func=cmd_search)

    export = actions.add_parser("export", parents=[common, user], help="print everything held on the user as JSON")
    export.set_defaults(func=cmd_export)

    forget = actions.add_parser("forget", parents=[common, user], help="delete everything held on the user")
    forget.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    forget.set_defaults(func=cmd_forget)

    load = actions.add_parser(
        "import",
        parents=[common, user],
        help="load past conversation (JSON lines) into recall storage",
        description='Each line: {"role": "user"|"assistant"|"system", "content": "...", '
        '"timestamp": "2024-05-01T10:00:00"} (no zone: UTC). Nothing is imported from a file with errors.',
    )
    load.add_argument("file", metavar="FILE.jsonl", type=Path)
    load.set_defaults(func=cmd_import)
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
        log_file = configure_logging(settings, verbose=args.verbose, counts_tokens=args.command == "chat")
        log.info("%s %s %s: settings %s", PROG, version(), command, settings.redacted())
        func: Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]] = args.func
        code = asyncio.run(func(args, settings))
        log.info("%s %s: exit %d", PROG, command, code)
        return code
    except (CLIError, ConfigError, StoreError, LLMUnavailableError, NoAdapterError) as error:
        log.info("%s %s failed: %s", PROG, command, error, extra={"file_only": True})
        return fail(str(error))
    except KeyboardInterrupt:
        if _isatty(sys.stderr):
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


def fail(message: str) -> int:
    text = " ".join(message.split()) or "failed"
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)
    return EXIT_ERROR


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


# -- logging -----------------------------------------------------------------
class _ConsoleFormatter(logging.Formatter):
    """One line per record, never a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{PROG}: {record.levelname.lower()}: {' '.join(record.getMessage().split())}"


def _not_file_only(record: logging.LogRecord) -> bool:
    return not getattr(record, "file_only", False)


def _not_tokenizer_note(record: logging.LogRecord) -> bool:
    # Memory commands count no tokens: a tokenizer fallback is no news to their user.
    return not (record.name == "memory.tokens" and record.levelno < logging.ERROR)


_handlers: list[logging.Handler] = []


def configure_logging(settings: Settings, *, verbose: bool, counts_tokens: bool = True) -> Path:
    """Root logging, once: standard error at WARNING (INFO with -v) and the
    data folder's log file at INFO (or MEMGPT_LOG_LEVEL), so that standard
    output stays clean for replies and results."""
    root = logging.getLogger()
    for handler in _handlers:  # run() called again in one process
        root.removeHandler(handler)
        handler.close()
    _handlers.clear()

    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO if verbose else logging.WARNING)
    console.setFormatter(_ConsoleFormatter())
    console.addFilter(_not_file_only)
    if not counts_tokens:
        console.addFilter(_not_tokenizer_note)
    _handlers.append(console)

    data_dir = Path(settings.data_dir)
    path = data_dir / LOG_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as error:
        raise CLIError(f"cannot write to the data folder {data_dir}: {error.strerror or error}") from None
    file_level = logging.getLevelNamesMapping().get(settings.log_level, logging.INFO)
    file_handler.setLevel(file_level)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    _handlers.append(file_handler)

    for handler in _handlers:
        root.addHandler(handler)
    root.setLevel(min(console.level, file_level))
    # sentence-transformers shows progress bars whenever its logger is at INFO.
    logging.getLogger("sentence_transformers").setLevel(logging.INFO if verbose else logging.WARNING)
    logging.captureWarnings(True)
    return path


# -- shared helpers ----------------------------------------------------------
async def open_runtime(settings: Settings) -> Runtime:
    from bot.runtime import Runtime  # imported here so `--help` stays fast

    # The embedder loads its model on first use only: commands that never embed never load it.
    return await Runtime.create(settings)


def _unknown(user: User) -> CLIError:
    return CLIError(f"no memory held for user {user.spec}")


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _write(text: str, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    out.write(text + "\n")
    out.flush()


def _dumps(payload: Any, *, indent: int | None = None) -> str:
    return json.dumps(payload, ensure_ascii=False, indent=indent)


async def _read_line(stream: TextIO) -> str | None:
    from adapters.terminal import read_lines

    async with aclosing(read_lines(stream)) as lines:
        async for line in lines:
            return line
    return None


# -- chat --------------------------------------------------------------------
async def cmd_chat(args: argparse.Namespace, settings: Settings) -> int:
    from adapters.terminal import TerminalChat

    if not settings.openai_api_key:
        raise CLIError(NO_API_KEY)
    user: User = args.user
    runtime = await open_runtime(settings)
    try:
        sent = await TerminalChat(runtime.handle, user.user_id, platform=user.platform).run()
        log.info("chat with %s ended: %d messages", user.key, sent)
    finally:
        await runtime.close()
    return EXIT_OK


# -- memory show -------------------------------------------------------------
async def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    runtime = await open_runtime(settings)
    try:
        description = await runtime.describe(user.key)
    finally:
        await runtime.close()
    if description is None:
        raise _unknown(user)
    _write(_dumps(description, indent=2) if args.json else render_description(description))
    return EXIT_OK


# -- memory search -----------------------------------------------------------
def _message_json(message: Message) -> dict[str, Any]:
    return {
        "seq": message.seq,
        "role": message.role,
        "name": message.name,
        "content": message.content,
        "tool_calls": message.tool_calls,
        "created_at": _iso(message.created_at),
    }


def _passage_json(passage: Passage, score: float) -> dict[str, Any]:
    return {
        "id": passage.id,
        "score": round(float(score), 4),
        "text": passage.text,
        "source": passage.source,
        "collection": getattr(passage, "collection", None),
        "position": passage.position,
        "created_at": _iso(passage.created_at),
    }


async def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    archival = args.archival is not None
    query: str = args.archival if archival else args.recall
    runtime = await open_runtime(settings)
    try:
        record = await runtime.store.find_agent(user.key)
        if record is None:
            raise _unknown(user)
        has_passages = archival and await runtime.store.count_passages(record.id) > 0
        if has_passages:
            # Passages a crash left without a vector become searchable first.
            await runtime.archival.resume_pending(record.id)

        async def answer(text: str) -> dict[str, Any]:
            results: list[dict[str, Any]] = []
            total = 0
            if archival:
                if has_passages and text.strip():
                    page = await runtime.archival.search(record.id, text, args.limit)
                    results = [_passage_json(passage, score) for passage, score in page.items]
                    total = page.total
            else:
                page = await runtime.store.search_messages(record.id, text, args.limit)
                results = [_message_json(message) for message in page.items]
                total = page.total
            return {"query": text, "store": "archival" if archival else "recall", "total": total, "results": results}

        if query == "-":
            from adapters.terminal import read_lines

            async with aclosing(read_lines(sys.stdin)) as lines:
                async for line in lines:
                    _write(_dumps(await answer(line)))
            return EXIT_OK
        found = await answer(query)
    finally:
        await runtime.close()
    if args.json:
        _write(_dumps(found, indent=2))
    else:
        _write(_render_search(found))
    return EXIT_OK


def _render_search(found: dict[str, Any]) -> str:
    results = found["results"]
    where = f"{found['store']} storage"
    if not results:
        return f"No match in {where} for {found['query']!r}."
    lines = [f"{len(results)} of {found['total']} matches in {where} for {found['query']!r}:"]
    for item in results:
        stamp = item["created_at"][:16].replace("T", " ")
        if found["store"] == "archival":
            head = f"  [{item['score']:.3f}] {stamp}"
            text = item["text"]
        else:
            head = f"  #{item['seq']} {stamp} {item['role']}"
            text = item["content"] or ", ".join(
                f"{call.get('function', {}).get('name', '?')}({call.get('function', {}).get('arguments', '')})"
                for call in item["tool_calls"] or []
            )
        body = text.splitlines() or [""]
        lines.append(f"{head}: {body[0]}")
        lines.extend(f"      {line}" for line in body[1:])
    return "\n".join(lines)


# -- memory export / forget --------------------------------------------------
async def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    runtime = await open_runtime(settings)
    try:
        data = await runtime.export(user.key)
    finally:
        await runtime.close()
    if data is None:
        raise _unknown(user)
    _write(_dumps(data, indent=2))
    return EXIT_OK


async def cmd_forget(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    runtime = await open_runtime(settings)
    try:
        record = await runtime.store.find_agent(user.key)
        if record is None:
            raise _unknown(user)
        messages = await runtime.store.count_messages(record.id)
        passages = await runtime.store.count_passages(record.id)
        held = f"{plural(messages, 'message')}, {plural(passages, 'passage')} and the working context"
        if not args.yes and _isatty(sys.stdin):
            sys.stderr.write(f"Delete everything held on {user.key} ({held})? This cannot be undone. [y/N] ")
            sys.stderr.flush()
            answer = await _read_line(sys.stdin)
            if (answer or "").strip().lower() not in ("y", "yes"):
                _write("Nothing deleted.")
                return EXIT_ERROR
        deleted = await runtime.forget(user.key)
    finally:
        await runtime.close()
    if not deleted:  # deleted by someone else in between
        raise _unknown(user)
    log.info("forgot %s (%s)", user.key, held)
    _write(f"Forgot {user.key}: deleted {held}.")
    return EXIT_OK


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# -- memory import -----------------------------------------------------------
def parse_history(path: Path) -> list[Message]:
    """Every line of a JSON lines file as a Message, or a CLIError naming the
    first bad line: a file with any error imports nothing."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CLIError(f"cannot read {path}: {reason}") from None
    messages: list[Message] = []
    errors: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            messages.append(_history_message(line))
        except ValueError as error:
            errors.append(f"{path} line {number}: {error}")
    if errors:
        more = f" (and {plural(len(errors) - 1, 'more bad line')})" if len(errors) > 1 else ""
        raise CLIError(f"{errors[0]}{more}; nothing was imported")
    return messages


def _history_message(line: str) -> Message:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg})") from None
    if not isinstance(item, dict):
        raise ValueError("expected a JSON object with role, content and timestamp")
    role = item.get("role")
    if role not in IMPORT_ROLES:
        raise ValueError(f"role must be one of {', '.join(IMPORT_ROLES)}, got {role!r}")
    content = item.get("content")
    if not isinstance(content, str) or not content.strip():
        raise ValueError("content must be a non-empty string")
    stamp = item.get("timestamp")
    if not isinstance(stamp, str):
        raise ValueError("timestamp must be an ISO 8601 string, e.g. 2024-05-01T10:00:00")
    try:
        moment = datetime.fromisoformat(stamp.strip())
    except ValueError:
        raise ValueError(f"timestamp is not ISO 8601: {stamp!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return Message(role=role, content=content, name="imported", created_at=moment.astimezone(UTC))


async def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    messages = parse_history(args.file)  # everything is validated before anything is stored
    runtime = await open_runtime(settings)
    try:
        count = await runtime.import_history(user.key, messages)
    finally:
        await runtime.close()
    log.info("imported %d messages for %s from %s", count, user.key, args.file)
    _write(f"Imported {plural(count, 'message')} into recall storage for {user.key}.")
    return EXIT_OK


if __name__ == "__main__":
    main()
