"""`memgpt-bot memory import`: past conversation into recall storage, or a
restore from `memgpt-bot memory export`.

Two formats are accepted: JSON lines (`{"role", "content", "timestamp"}` per
line) and the export's own JSON object (messages, passages and working
context). A message already held (same role, content and time) is skipped, so
running an import twice, or restoring over what is left, adds nothing twice.
A file with any error imports nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from bot.config import Settings
from bot.reports import plural
from cli.args import User
from cli.common import EXIT_OK, CLIError, embed_recall, open_runtime, write
from memory.search.conversation import embeddable
from memory.types import Block, BlockLine, Message, Passage, Role, utc_now
from memory.working_context import lines_from_before_places

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger("memgpt_bot.cli")

IMPORT_ROLES = ("user", "assistant", "system")
RESTORE_ROLES: tuple[str, ...] = get_args(Role)


@dataclass(slots=True)
class History:
    messages: list[Message]
    passages: list[Passage] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    restore: bool = False  # read from an export


def add_import_command(actions: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[Any]) -> None:
    load = actions.add_parser(
        "import",
        parents=parents,
        help="load past conversation (JSON lines), or restore a `memory export`",
        description='JSON lines, each {"role": "user"|"assistant"|"system", "content": "...", '
        '"timestamp": "2024-05-01T10:00:00"} (no zone: UTC); or the JSON that `memory export` prints '
        "(messages, passages and, for a user with no memory yet, the working context). Messages already "
        "held (same role, content and time) and passages already held are skipped. Nothing is imported "
        "from a file with errors.",
    )
    load.add_argument("file", metavar="FILE", type=Path)
    load.set_defaults(func=cmd_import)


# -- reading ---------------------------------------------------------------------
def parse_history(path: Path) -> History:
    """The file's messages (and, from an export, passages and blocks), or a
    CLIError naming the first bad line or item."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CLIError(f"cannot read {path}: {reason}") from None
    exported = _as_export(text)
    if exported is not None:
        return _restore(path, exported)
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
    return History(messages)


def _as_export(text: str) -> dict[str, Any] | None:
    """The export's object, when the file is one (a JSON object with messages)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        item = json.loads(text)
    except json.JSONDecodeError:
        return None  # perhaps JSON lines: each line is checked on its own
    return item if isinstance(item, dict) and isinstance(item.get("messages"), list) else None


def _moment(stamp: Any) -> datetime:
    if not isinstance(stamp, str):
        raise ValueError("timestamp must be an ISO 8601 string, e.g. 2024-05-01T10:00:00")
    try:
        moment = datetime.fromisoformat(stamp.strip())
    except ValueError:
        raise ValueError(f"timestamp is not ISO 8601: {stamp!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


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
    return Message(role=role, content=content, name="imported", created_at=_moment(item.get("timestamp")))


def _restore(path: Path, exported: dict[str, Any]) -> History:
    history = History([], restore=True)
    where = "the file"
    try:
        for number, item in enumerate(exported["messages"], start=1):
            where = f"message {number}"
            if not isinstance(item, dict) or item.get("role") not in RESTORE_ROLES:
                raise ValueError(f"role must be one of {', '.join(RESTORE_ROLES)}")
            history.messages.append(
                Message(
                    role=item["role"],
                    content=item.get("content"),
                    tool_calls=item.get("tool_calls"),
                    tool_call_id=item.get("tool_call_id"),
                    name="imported",
                    created_at=_moment(item.get("created_at")),
                )
            )
        for number, item in enumerate(exported.get("passages") or [], start=1):
            where = f"passage {number}"
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                raise ValueError("text must be a string")
            history.passages.append(
                Passage(
                    text=item["text"],
                    source=item.get("source"),
                    position=item.get("position"),
                    created_at=_moment(item.get("created_at")),
                )
            )
        for label, block in (exported.get("working_context") or {}).items():
            where = f"working context block {label!r}"
            if not isinstance(block, dict) or not isinstance(block.get("value"), str):
                raise ValueError("value must be a string")
            history.blocks.append(_block(label, block))
    except (ValueError, KeyError, TypeError) as error:
        raise CLIError(f"{path}: {where}: {error}; nothing was imported") from None
    return history


def _block(label: str, exported: dict[str, Any]) -> Block:
    """An exported block; one from before lines had places counts as written in the DM (the safe side)."""
    if "lines" not in exported:
        written = lines_from_before_places(exported["value"], utc_now())
        return Block(label, limit=int(exported["limit"]), lines=written)
    lines = [BlockLine.from_record(record) for record in exported["lines"]]
    return Block(label, limit=int(exported["limit"]), lines=lines)


def message_key(message: Message) -> tuple[str, str, str, int]:
    """What makes two messages the same for an import: role, content (or the
    calls) and time to the millisecond (MongoDB keeps milliseconds)."""
    calls = json.dumps(message.tool_calls, sort_keys=True) if message.tool_calls else ""
    return (message.role, message.content or "", calls, int(message.created_at.timestamp() * 1000))


# -- the command -------------------------------------------------------------------
async def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    history = parse_history(args.file)  # everything is validated before anything is stored
    async with open_runtime(settings) as runtime:
        record = await runtime.store.find_agent(user.key)
        held = {message_key(m) for m in await runtime.store.messages_since(record.id, 0)} if record else set()
        fresh: list[Message] = []
        for message in history.messages:
            key = message_key(message)
            if key not in held:
                held.add(key)
                fresh.append(message)
        count = await runtime.import_history(user.key, fresh)
        restored = await _restore_archive(runtime, user.key, history, new_user=record is None)
        agent = await runtime.store.find_agent(user.key)
        if count and agent is not None:
            # Searchable by meaning when this returns, not only after the agent's next searches.
            await embed_recall(runtime, agent.id, sum(1 for message in fresh if embeddable(message)))
    skipped = len(history.messages) - len(fresh)
    log.info("imported %d messages (%d already held) for %s from %s", count, skipped, user.key, args.file)
    note = f" ({plural(skipped, 'message')} already held, skipped)" if skipped else ""
    write(f"Imported {plural(count, 'message')} into recall storage for {user.key}{note}.{restored}")
    return EXIT_OK


async def _restore_archive(runtime: Runtime, key: str, history: History, *, new_user: bool) -> str:
    """Passages not yet held, and (for a user with no memory before) the working
    context; a sentence saying what was restored."""
    if not history.restore:
        return ""
    record = await runtime.store.find_agent(key)
    if record is None:  # an export with no messages at all, for a new user
        record, _ = await runtime.store.get_or_create_agent(key, history.blocks)
    said = []
    if new_user:
        for block in history.blocks:
            await runtime.store.save_block(record.id, block)
        said.append("the working context")
    count = await runtime.store.count_passages(record.id)
    texts = {p.text for p in await runtime.store.list_passages(record.id, count, 0)} if count else set()
    passages = []
    for passage in history.passages:
        if passage.text not in texts:
            texts.add(passage.text)
            passages.append(passage)
    if passages:
        await runtime.archival.insert(record.id, passages)
        await runtime.archival.settle(record.id)
    said.append(plural(len(passages), "passage"))
    return f" Restored {' and '.join(said)}."
