"""`memgpt-bot memory show|search|export|forget`: what the bot holds on a user.

(`memory import` is in cli/history.py.)
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, TypeVar

from bot.config import Settings
from bot.forgetting.ledger import PAGE_SIZE, Item, UnknownItem, describe_found, ledger_items
from bot.reports import plural, render_description
from cli.args import User
from cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    CLIError,
    dumps,
    embed_recall,
    isatty,
    iso,
    open_runtime,
    read_line,
    unknown,
    write,
)
from memory.places import Place, Visibility
from memory.types import Message, Passage

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger("memgpt_bot.cli")
T = TypeVar("T")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def place_key(text: str) -> Place:
    """`--place`: a conversation key, "dm", "private:<channel id>" or "public:<channel id>"."""
    place = Place.from_key(text.strip())
    if place.key != text.strip():
        raise argparse.ArgumentTypeError(f"not a place: {text!r}; use dm, private:CHANNEL_ID or public:CHANNEL_ID")
    return place


def add_memory_commands(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: list[argparse.ArgumentParser],
) -> None:
    """`show`, `search`, `export` and `forget` under `memory`; `parents` carry
    the global options and `--user`."""
    show = actions.add_parser(
        "show",
        parents=parents,
        help="what is held, item by item, with where and when each was learned",
        description="Working context, summaries and counts, then every item held (notes, saved passages, "
        "summaries, messages per place) with its id for `memory forget --item`.",
    )
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--page", type=_positive, metavar="N", help="only page N of the items (10 a page)")
    show.set_defaults(func=cmd_show)

    search = actions.add_parser(
        "search",
        parents=parents,
        help="search recall or archival storage",
        description="Search recall storage (words) or archival storage (meaning). With '-' as the query, "
        "queries are read one a line from standard input and answered as JSON lines, in order. "
        "Results are listed best first, numbered by rank.",
    )
    where = search.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--recall", metavar="QUERY", help="search every past message as the agent does (meaning, words, context, time)"
    )
    where.add_argument("--archival", metavar="QUERY", help="search saved passages by meaning")
    search.add_argument("--limit", type=_positive, default=10, metavar="K", help="results per query (default 10)")
    search.add_argument(
        "--place",
        type=place_key,
        metavar="dm|private:ID|public:ID",
        help="search as from this place: only what the agent may read there (default: everything)",
    )
    search.add_argument("--json", action="store_true", help="print JSON")
    search.set_defaults(func=cmd_search)

    export = actions.add_parser(
        "export",
        parents=parents,
        help="print everything held on the user as JSON (`memory import` restores its messages)",
    )
    export.set_defaults(func=cmd_export)

    forget = actions.add_parser(
        "forget",
        parents=parents,
        help="delete everything held on the user, one item, or everything about a topic",
        description="Without --about or --item, deletes everything. With --about, finds the messages, passages, "
        "notes and summaries about the topic (the agent's own search), shows them, and deletes them and "
        "rewrites the summaries. Asks for confirmation at a terminal; without one (a pipe, a script) --yes "
        "is required.",
    )
    what = forget.add_mutually_exclusive_group()
    what.add_argument("--about", metavar="WORDS", help="forget everything about this topic, everywhere")
    what.add_argument(
        "--item", metavar="ID", help="forget one item of `memory show` (note:ID, passage:N, summary:PLACE, channel:KEY)"
    )
    forget.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    forget.set_defaults(func=cmd_forget)


# -- show ----------------------------------------------------------------------
async def held_on(settings: Settings, user: User, read: Callable[[Runtime], Awaitable[T | None]]) -> T:
    """What `read` finds on a user, or the one-line "no memory held" error."""
    async with open_runtime(settings) as runtime:
        found = await read(runtime)
    if found is None:
        raise unknown(user)
    return found


async def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user

    async def read(runtime: Runtime) -> tuple[dict[str, Any] | None, list[Item]] | None:
        description = await runtime.describe(user.key)
        record = await runtime.store.find_agent(user.key)
        if args.page:
            page = await runtime.ledger(user.key, args.page)
            items = page.items if page else []
        else:
            own = await ledger_items(runtime.store, record.id) if record is not None else []
            items = own + await runtime.channel_items(user.key)  # what channel memories hold of them
        if (description is None or record is None) and not items:
            return None
        return description, items

    description, items = await held_on(settings, user, read)
    if args.json:
        shown = description or {"user": user.key}
        shown["items"] = [
            {"id": i.id, "kind": i.kind, "text": i.text, "place": i.place, "at": iso(i.at)} for i in items
        ]
        write(dumps(shown, indent=2))
        return EXIT_OK
    first = ((args.page or 1) - 1) * PAGE_SIZE + 1
    listing = [item.line(first + n) for n, item in enumerate(items)]
    head = render_description(description) + "\n\n" if description is not None else ""
    write(head + "Items held (forget one: memory forget --item ID):\n" + "\n".join(listing))
    return EXIT_OK


# -- search --------------------------------------------------------------------
def message_json(message: Message, rank: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "seq": message.seq,
        "role": message.role,
        "name": message.name,
        "content": message.content,
        "tool_calls": message.tool_calls,
        "created_at": iso(message.created_at),
        "place": message.place,
    }


def passage_json(passage: Passage, score: float, rank: int) -> dict[str, Any]:
    return {
        "rank": rank,
        # The hybrid ranking's internal score: comparable within one answer only.
        "score": round(float(score), 4),
        "id": passage.id,
        "text": passage.text,
        "source": passage.source,
        "collection": getattr(passage, "collection", None),
        "position": passage.position,
        "created_at": iso(passage.created_at),
        "place": passage.place,
    }


async def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    archival = args.archival is not None
    query: str = args.archival if archival else args.recall
    # As the admin by default; with --place, what the agent may read there.
    visible = Visibility.of(args.place) if args.place else None
    async with open_runtime(settings) as runtime:
        record = await runtime.store.find_agent(user.key)
        if record is None:
            raise unknown(user)
        has_passages = archival and await runtime.store.count_passages(record.id) > 0
        if has_passages:
            # Passages a crash left without a vector become searchable first.
            await runtime.archival.resume_pending(record.id)
        if not archival:
            await embed_recall(runtime, record.id)  # every message ranked by meaning too, as after a day of use

        async def answer(text: str) -> dict[str, Any]:
            results: list[dict[str, Any]] = []
            total = 0
            if archival:
                if has_passages and text.strip():
                    found = await runtime.archival.search(record.id, text, args.limit, visible=visible)
                    results = [passage_json(p, score, rank) for rank, (p, score) in enumerate(found.items, 1)]
                    total = found.total
            else:
                # The agent's own conversation search (meaning, stemmed keywords, context, speaker, time).
                page = await runtime.recall.search(record.id, text, args.limit, visible=visible)
                results = [message_json(message, rank) for rank, message in enumerate(page.items, 1)]
                total = page.total
            return {"query": text, "store": "archival" if archival else "recall", "total": total, "results": results}

        if query == "-":
            from adapters.terminal import read_lines

            async with aclosing(read_lines(sys.stdin)) as lines:
                async for line in lines:
                    write(dumps(await answer(line)))
            return EXIT_OK
        found = await answer(query)
    write(dumps(found, indent=2) if args.json else render_search(found))
    return EXIT_OK


def render_search(found: dict[str, Any]) -> str:
    """Results best first, numbered by rank (raw hybrid scores mean nothing to a reader)."""
    results = found["results"]
    where = f"{found['store']} storage"
    if not results:
        return f"No match in {where} for {found['query']!r}."
    lines = [f"{len(results)} of {found['total']} matches in {where} for {found['query']!r}, best first:"]
    for item in results:
        stamp = item["created_at"][:16].replace("T", " ")
        if found["store"] == "archival":
            head = f"  {item['rank']}. {stamp}"
            text = item["text"]
        else:
            head = f"  {item['rank']}. #{item['seq']} {stamp} {item['role']}"
            text = item["content"] or ", ".join(
                f"{call.get('function', {}).get('name', '?')}({call.get('function', {}).get('arguments', '')})"
                for call in item["tool_calls"] or []
            )
        body = text.splitlines() or [""]
        lines.append(f"{head}: {body[0]}")
        lines.extend(f"      {line}" for line in body[1:])
    return "\n".join(lines)


# -- export / forget -------------------------------------------------------------
async def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    data = await held_on(settings, user, lambda runtime: runtime.export(user.key))
    write(dumps(data, indent=2))
    return EXIT_OK


async def confirmed(question: str) -> bool:
    sys.stderr.write(f"{question} This cannot be undone. [y/N] ")
    sys.stderr.flush()
    answer = await read_line(sys.stdin)
    return (answer or "").strip().lower() in ("y", "yes")


async def cmd_forget(args: argparse.Namespace, settings: Settings) -> int:
    user: User = args.user
    if not args.yes and not isatty(sys.stdin):
        # Piped input is no answer: `echo no | ... forget` must not delete, nor must `yes |`.
        raise CLIError(f"refusing to delete {user.spec}'s memory without a terminal to confirm at: add --yes")
    if args.about is not None or args.item is not None:
        return await forget_some(args, user, settings)
    async with open_runtime(settings) as runtime:
        record = await runtime.store.find_agent(user.key)
        in_channels = sum((await runtime.channel_memory.speaker_counts(user.key)).values())
        if record is None and not in_channels:
            raise unknown(user)
        messages = await runtime.store.count_messages(record.id) if record is not None else 0
        passages = await runtime.store.count_passages(record.id) if record is not None else 0
        held = f"{plural(messages, 'message')}, {plural(passages, 'passage')} and the working context"
        if in_channels:
            held += f", and {plural(in_channels, 'message')} kept by channels"
        if not args.yes and not await confirmed(f"Delete everything held on {user.key} ({held})?"):
            write("Nothing deleted.")
            return EXIT_ERROR
        deleted = await runtime.forget(user.key)
    if not deleted:  # deleted by someone else in between
        raise unknown(user)
    log.info("forgot %s (%s)", user.key, held)
    write(f"Forgot {user.key}: deleted {held}.")
    return EXIT_OK


async def forget_some(args: argparse.Namespace, user: User, settings: Settings) -> int:
    """`forget --about WORDS` (shown first, then confirmed) or `forget --item ID`."""
    async with open_runtime(settings) as runtime:
        if await runtime.store.find_agent(user.key) is None and not await runtime.channel_items(user.key):
            raise unknown(user)
        if args.item is not None:
            if not args.yes and not await confirmed(f"Delete item {args.item} of {user.key}?"):
                write("Nothing deleted.")
                return EXIT_ERROR
            try:
                receipt = await runtime.forget_one(user.key, args.item)
            except UnknownItem as error:
                raise CLIError(str(error)) from None
        else:
            about = str(args.about).strip()
            if not about:
                raise CLIError("--about needs words: what to forget")
            found = await runtime.preview_forget(user.key, about)
            write(describe_found(found, shown=50))
            if found.empty:
                return EXIT_OK
            if not args.yes and not await confirmed(f"Delete all of this for {user.key}, everywhere?"):
                write("Nothing deleted.")
                return EXIT_ERROR
            receipt = await runtime.forget_topic(user.key, about)
    log.info("selective forget for %s: %s", user.key, receipt)
    write(receipt.text())
    return EXIT_OK
