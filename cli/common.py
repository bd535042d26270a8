"""What every `memgpt-bot` command shares: the one-line error, output helpers,
and opening the runtime.

Commands import this module, never cli/main.py: `python -m cli.main` runs that
file as __main__, and importing it again would make a second copy (with its
own CLIError class that the first copy's handler never catches).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from bot.config import Settings

if TYPE_CHECKING:
    from bot.runtime import Runtime
    from cli.args import User

log = logging.getLogger("memgpt_bot.cli")

PROG = "memgpt-bot"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
NO_API_KEY = (
    "OPENAI_API_KEY is not set: chat needs it. Set it in the environment or in .env "
    "(e.g. OPENAI_API_KEY=sk-...); local OpenAI-compatible servers (Ollama, llama.cpp, vLLM) "
    "accept any value, e.g. OPENAI_API_KEY=local with OPENAI_BASE_URL pointing at them"
)


class CLIError(Exception):
    """A failure to report as one line on standard error."""


def fail(message: str) -> int:
    """Print `memgpt-bot: error: MESSAGE` (one line) and return the error exit status."""
    text = " ".join(message.split()) or "failed"
    log.info("failed: %s", text, extra={"file_only": True})
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def write(text: str, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    out.write(text + "\n")
    out.flush()


def dumps(payload: Any, *, indent: int | None = None) -> str:
    return json.dumps(payload, ensure_ascii=False, indent=indent)


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def unknown(user: User) -> CLIError:
    return CLIError(f"no memory held for user {user.spec}")


async def read_line(stream: TextIO) -> str | None:
    from adapters.terminal import read_lines

    async with aclosing(read_lines(stream)) as lines:
        async for line in lines:
            return line
    return None


@asynccontextmanager
async def open_runtime(
    settings: Settings, *, talks_to_llm: bool = False, warm_up: bool = False
) -> AsyncIterator[Runtime]:
    """The runtime for a command, closed when the `async with` block ends.
    `talks_to_llm` (chat, run): the API key must be set and the context window
    must hold the fixed prompt, checked before anything is sent. `warm_up`: the
    embedding model starts loading in the background (seconds of CPU), so that
    the first search rarely waits for it."""
    from bot.runtime import Runtime  # imported here so `--help` stays fast

    if talks_to_llm and not settings.openai_api_key:
        raise CLIError(NO_API_KEY)
    runtime = await Runtime.create(settings)
    try:
        if talks_to_llm:
            settings.check_window(fixed_prompt_tokens(runtime))
        freeze_start_up_heap()
        if warm_up:
            warm_up_in_background(runtime)
        yield runtime
    finally:
        await runtime.close()


def freeze_start_up_heap() -> None:
    """What start-up built (modules, the openai and pydantic types, the
    tokenizer, settings) lives as long as the process: frozen, the garbage
    collector's full passes stop walking it again and again. With 1,000 agents
    loaded that was ~1.9 ms of CPU per event, a third of the bot's
    (bench/throughput_processes.py on SQLite: 5.9 -> 4.0 ms per event)."""
    gc.collect()
    gc.freeze()


_background: set[asyncio.Task[None]] = set()


def warm_up_in_background(runtime: Runtime) -> None:
    async def load() -> None:
        started = time.perf_counter()
        await runtime.embedder.warm_up()
        log.info("embedding model warmed up in %.1f s", time.perf_counter() - started)

    task = asyncio.create_task(load(), name="embedder-warm-up")
    _background.add(task)
    task.add_done_callback(_warmed)


def _warmed(task: asyncio.Task[None]) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        # Not fatal: the first search loads it again, and says why it cannot.
        log.warning("the embedding model could not be loaded in the background: %s", task.exception())


def fixed_prompt_tokens(runtime: Runtime) -> int:
    """Tokens of every request's unchanging part: the system instructions, the
    function schemas and the working context at its defaults."""
    from bot.conversation import place_instructions
    from memory.places import Place
    from memory.working_context import WorkingContext, default_blocks

    services, settings = runtime.services, runtime.settings
    counter = services.counter
    blocks = WorkingContext(
        default_blocks(settings.persona_limit, settings.human_limit, private_limit=settings.private_limit)
    )
    # The longest where-you-are text: a channel's (bot/conversation.py).
    channel = place_instructions(services.instructions, Place("public", "C0000000000", "#a-long-channel-name"))
    return (
        counter.count(channel)
        + counter.count_tools(services.functions.schemas)
        + counter.count(blocks.render())
        + 64  # section headings, the memory status line and the message wrappers
    )


async def embed_recall(runtime: Runtime, agent_id: str, total: int | None = None) -> int:
    """Embed every message of the agent still without a vector before going on
    (after an import, before a search: results as complete as the agent's own
    a day later), with a progress bar on a terminal's standard error."""
    from tqdm import tqdm

    with tqdm(
        total=total, desc="embed", unit="message", file=sys.stderr, delay=2.0, disable=not isatty(sys.stderr)
    ) as bar:
        return await runtime.recall.embed_all(agent_id, bar.update)
