"""The `load` and `sources` commands of `memgpt-bot`.

    memgpt-bot load --user NAME PATH...            into one user's own archival storage
    memgpt-bot sources create NAME                 a shared collection
    memgpt-bot sources load NAME PATH...           files and folders into it
    memgpt-bot sources attach NAME (--user NAME | --all)
    memgpt-bot sources detach NAME (--user NAME | --all)
    memgpt-bot sources list [--json]
    memgpt-bot sources delete NAME --yes

Errors are CLIError (cli/common.py): one line, printed by cli/main.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.config import Settings
from bot.reports import plural
from cli.args import user_argument
from cli.common import EXIT_OK, PROG, CLIError, fail, open_runtime, write
from memory.store import SOURCE_KEY_PREFIX, SourceRecord

if TYPE_CHECKING:
    from bot.runtime import Runtime
    from memory.ingest.loader import LoadReport

log = logging.getLogger("memgpt_bot.cli.documents")

SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


# -- arguments ----------------------------------------------------------------------
def _user_key(spec: str) -> str:
    return user_argument(spec).key


def _source_name(text: str) -> str:
    if not SOURCE_NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"bad collection name {text!r}: use letters, digits, '.', '_' or '-' (at most 64, no spaces)"
        )
    return text


def _chunk_options(parser: argparse.ArgumentParser) -> None:
    from memory.ingest.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP_TOKENS

    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files or folders (walked recursively)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help=f"tokens per passage at most (default {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--overlap",
        type=int,
        default=DEFAULT_OVERLAP_TOKENS,
        metavar="N",
        help=f"tokens repeated from the previous passage (default {DEFAULT_OVERLAP_TOKENS})",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def add_document_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser | None = None
) -> None:
    """Register `load` and `sources` on the main parser's subcommands;
    `common` is the parent parser holding the global options."""
    parents = [common] if common is not None else []
    load = commands.add_parser(
        "load",
        parents=parents,
        help="load text, Markdown, HTML and PDF files into a user's archival storage",
        description="Chunk files (folders are walked; hidden files skipped) into passages and embed them. "
        "Files loaded before are skipped; an interrupted load continues when run again.",
    )
    load.add_argument(
        "--user",
        required=True,
        type=_user_key,
        metavar="NAME",
        help="a terminal user's name, or PLATFORM:ID (discord:1234, slack:T01:U02)",
    )
    _chunk_options(load)
    load.set_defaults(func=cmd_load)

    sources = commands.add_parser(
        "sources",
        parents=parents,
        help="shared document collections, searched by the agents they are attached to",
    )
    actions = sources.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser("create", parents=parents, help="create an empty collection")
    create.add_argument("name", type=_source_name, metavar="NAME")
    create.set_defaults(func=cmd_sources_create)

    fill = actions.add_parser("load", parents=parents, help="load files and folders into a collection")
    fill.add_argument("name", type=_source_name, metavar="NAME")
    _chunk_options(fill)
    fill.set_defaults(func=cmd_sources_load)

    for verb, func, what in (
        ("attach", cmd_sources_attach, "let a user's agent (or every agent) search it"),
        ("detach", cmd_sources_detach, "stop a user's agent (or every agent) searching it"),
    ):
        parser = actions.add_parser(verb, parents=parents, help=what)
        parser.add_argument("name", type=_source_name, metavar="NAME")
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", type=_user_key, metavar="NAME", help="one user (NAME or PLATFORM:ID)")
        who.add_argument("--all", action="store_true", help="every user, including users who arrive later")
        parser.set_defaults(func=func)

    listing = actions.add_parser("list", parents=parents, help="collections, their size and who searches them")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_sources_list)

    delete = actions.add_parser("delete", parents=parents, help="delete a collection and its passages")
    delete.add_argument("name", type=_source_name, metavar="NAME")
    delete.add_argument("--yes", "-y", action="store_true", help="required: deleting cannot be undone")
    delete.set_defaults(func=cmd_sources_delete)


# -- helpers --------------------------------------------------------------------------
async def _source(runtime: Runtime, name: str) -> SourceRecord:
    source = await runtime.store.find_source(name)
    if source is None:
        raise CLIError(f"no collection named {name!r} (create it with: {PROG} sources create {name})")
    return source


async def _load(runtime: Runtime, agent_id: str, args: argparse.Namespace, where: str) -> int:
    from memory.ingest.loader import load_paths

    if args.max_tokens < 16 or args.overlap < 0:
        raise CLIError("--max-tokens must be at least 16 and --overlap at least 0")
    try:
        report = await load_paths(
            runtime.archival,
            agent_id,
            args.paths,
            counter=runtime.services.counter,
            max_tokens=args.max_tokens,
            overlap_tokens=args.overlap,
            label=f"loading into {where}",
        )
    except asyncio.CancelledError:
        sys.stderr.write(f"{PROG}: load interrupted; what was stored is kept: run the same command to continue\n")
        raise
    for result in report.failed:
        log.warning("could not load %s: %s", result.name, result.reason)
    log.info("loaded into %s: %s", where, _summary(report, where))
    write(
        json.dumps(_report_json(report, where), ensure_ascii=False, indent=2) if args.json else _summary(report, where)
    )
    if report.failed:
        failed = report.failed
        shown = ", ".join(result.name for result in failed[:5]) + (" ..." if len(failed) > 5 else "")
        return fail(f"{plural(len(failed), 'file')} of {len(report.files)} could not be loaded: {shown}")
    return EXIT_OK


def _summary(report: LoadReport, where: str) -> str:
    loaded = report.loaded
    lines = [
        f"Loaded {plural(len(loaded), 'file')} into {where}: {plural(report.passages_added, 'new passage')} "
        f"in {report.seconds:.1f} s ({report.passages_per_second:.1f} passages/s)."
    ]
    existing = sum(result.passages_existing for result in loaded)
    if existing:
        lines.append(f"{plural(existing, 'passage')} of these files were already stored and kept once.")
    if report.unchanged:
        names = ", ".join(result.name for result in report.unchanged)
        lines.append(f"Already loaded, skipped: {names}.")
    if report.skipped:
        lines.append(f"Not text, Markdown, HTML or PDF, skipped: {', '.join(report.skipped)}.")
    return "\n".join(lines)


def _report_json(report: LoadReport, where: str) -> dict[str, Any]:
    return {
        "into": where,
        "passages_added": report.passages_added,
        "seconds": round(report.seconds, 3),
        "files": [
            {
                "name": r.name,
                "status": r.status,
                "passages_added": r.passages_added,
                "passages_existing": r.passages_existing,
                "reason": r.reason or None,
            }
            for r in report.files
        ],
        "skipped": report.skipped,
    }


# -- commands ---------------------------------------------------------------------------
async def cmd_load(args: argparse.Namespace, settings: Settings) -> int:
    key: str = args.user
    async with open_runtime(settings) as runtime:
        agent = await runtime.agent(key)
        return await _load(runtime, agent.id, args, f"{key}'s archival storage")


async def cmd_sources_create(args: argparse.Namespace, settings: Settings) -> int:
    async with open_runtime(settings) as runtime:
        _, created = await runtime.store.create_source(args.name)
    if not created:
        raise CLIError(f"a collection named {args.name!r} already exists")
    write(f"Created collection {args.name}. Load files with: {PROG} sources load {args.name} PATH...")
    return EXIT_OK


async def cmd_sources_load(args: argparse.Namespace, settings: Settings) -> int:
    async with open_runtime(settings) as runtime:
        source = await _source(runtime, args.name)
        return await _load(runtime, source.id, args, f"collection {args.name}")


async def cmd_sources_attach(args: argparse.Namespace, settings: Settings) -> int:
    async with open_runtime(settings) as runtime:
        source = await _source(runtime, args.name)
        if args.all:
            await runtime.store.attach_source(source.id, None)
            said = f"Attached {args.name} to every user, including users who arrive later."
        else:
            # Created now if need be, so the collection is there at the user's first message.
            agent = await runtime.agent(args.user)
            await runtime.store.attach_source(source.id, agent.id)
            said = f"Attached {args.name} to {args.user}."
    write(said)
    return EXIT_OK


async def cmd_sources_detach(args: argparse.Namespace, settings: Settings) -> int:
    async with open_runtime(settings) as runtime:
        source = await _source(runtime, args.name)
        if args.all:
            await runtime.store.detach_source(source.id, None)
            said = f"Detached {args.name} from every user."
        else:
            record = await runtime.store.find_agent(args.user)
            if record is None:
                raise CLIError(f"no memory held for user {args.user}")
            await runtime.store.detach_source(source.id, record.id)
            said = f"Detached {args.name} from {args.user}."
    write(said)
    return EXIT_OK


async def cmd_sources_list(args: argparse.Namespace, settings: Settings) -> int:
    async with open_runtime(settings) as runtime:
        store = runtime.store
        keys = {agent.id: agent.key for agent in await store.list_agents()}
        people = {agent_id: key for agent_id, key in keys.items() if not key.startswith(SOURCE_KEY_PREFIX)}
        rows = []
        for source in await store.list_sources():
            attached = [keys.get(agent_id, agent_id) for agent_id in await store.source_attachments(source.id)]
            # Attached to all, minus those detached one by one (`detach NAME --user`).
            excluded = [
                key
                for agent_id, key in people.items()
                if source.attach_all and source.id not in {s.id for s in await store.attached_sources(agent_id)}
            ]
            rows.append(
                {
                    "name": source.name,
                    "passages": await store.count_passages(source.id),
                    "files": len(await store.list_documents(source.id)),
                    "attach_all": source.attach_all,
                    "attached_to": sorted(attached),
                    "detached": sorted(excluded),
                    "created_at": source.created_at.isoformat(),
                }
            )
    if args.json:
        write(json.dumps(rows, ensure_ascii=False, indent=2))
    elif not rows:
        write(f"No collections yet. Create one with: {PROG} sources create NAME")
    else:
        write("\n".join(_render_source(row) for row in rows))
    return EXIT_OK


def _render_source(row: dict[str, Any]) -> str:
    who: Sequence[str] = row["attached_to"]
    if row["attach_all"]:
        attached = "every user" + (f" except {', '.join(row['detached'])}" if row["detached"] else "")
    elif who:
        attached = ", ".join(who)
    else:
        attached = "nobody yet"
    size = f"{plural(row['passages'], 'passage')} from {plural(row['files'], 'file')}"
    return f"{row['name']}: {size}; searched by {attached}"


async def cmd_sources_delete(args: argparse.Namespace, settings: Settings) -> int:
    if not args.yes:
        raise CLIError(f"deleting collection {args.name!r} cannot be undone: add --yes to confirm")
    async with open_runtime(settings) as runtime:
        source = await _source(runtime, args.name)
        passages = await runtime.store.count_passages(source.id)
        await runtime.store.delete_agent(source.id)
    write(f"Deleted collection {args.name} ({plural(passages, 'passage')}).")
    return EXIT_OK
