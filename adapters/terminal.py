"""The terminal chat adapter: standard input in, the agent's replies out.

Each non-empty input line becomes one `UserMessage`; each reply text is printed
on its own line to standard output and flushed at once. At a terminal a short
banner and a `you> ` prompt go to standard error, so that standard output only
ever carries the replies and the adapter is as scriptable through a pipe as it
is usable by hand. End of input ends the chat.

The smallest platform of the contract (adapters/pipeline.py): a line is an
arrival, `build` makes its `UserMessage`, `send` prints a reply. Each line
takes the same durable path as a Slack or Discord message (recorded, in the
person's lane, answered, finished), and the next is read once it is answered.
Like every adapter it knows nothing of memory: it calls only the `EventPort`.
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
import uuid
from collections.abc import AsyncGenerator, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, TextIO

from adapters.pipeline import Arrival, Item, Pipeline
from bot.events import Delivery, Reply, UserMessage
from bot.ports import EventPort

PLATFORM = "terminal"
PROMPT = "you> "


async def read_lines(stream: TextIO) -> AsyncGenerator[str]:
    """Lines of `stream` (without their line ending) without blocking the event loop.

    A daemon thread does the blocking reads, so a pending read never keeps the
    process alive at exit (an executor thread would: asyncio.run waits for it).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue()

    def put(item: str | BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def reader() -> None:
        try:
            for line in iter(stream.readline, ""):
                put(line)
        except (OSError, ValueError) as error:  # closed or unreadable stream
            put(error)
            return
        put(None)

    threading.Thread(target=reader, name="terminal-stdin", daemon=True).start()
    while True:
        item = await queue.get()
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        yield item.rstrip("\r\n")


class TerminalChat:
    """One person chatting with their agent through standard input and output."""

    redelivers = False  # a line is read once

    def __init__(
        self,
        bot: EventPort,
        user_id: str,
        *,
        platform: str = PLATFORM,
        display_name: str | None = None,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        interactive: bool | None = None,
    ) -> None:
        self.name = platform
        self.user_id = user_id
        self.display_name = display_name or user_id
        if stdin is None and isinstance(sys.stdin, io.TextIOWrapper):
            # Bytes that are not UTF-8 become U+FFFD, as on the other platforms:
            # "strict" would end the chat, the C locale's "surrogateescape" would
            # pass lone surrogates on (bot/sanitize.py catches those too).
            sys.stdin.reconfigure(errors="replace")
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.interactive = _isatty(self.stdin) if interactive is None else interactive
        self.pipeline = Pipeline(bot, self)
        self._finishing: asyncio.Task[None] | None = None  # the last line's work, once it is answered

    # -- the platform contract (adapters/pipeline.py) -----------------------------
    def arrival_of(self, payload: Mapping[str, Any]) -> Arrival:
        return Arrival(str(payload["event_id"]), str(payload["user_id"]), PLATFORM, dict(payload))

    async def build(self, arrival: Arrival) -> list[Item]:
        payload = arrival.payload
        message = UserMessage(
            platform=self.name,
            user_id=arrival.user_id,
            text=str(payload["text"]),
            display_name=str(payload["display_name"]),
            channel="terminal",
            event_id=arrival.event_id,
            in_inbox=arrival.in_inbox,
        )
        return [message]

    async def send(self, reply: Reply, answering: Arrival | None) -> tuple[Delivery, str]:
        self.stdout.write(reply.text + "\n")
        self.stdout.flush()
        return Delivery.SENT, ""

    def notice(self, arrival: Arrival, text: str) -> Reply:
        return Reply(text, self.name, arrival.user_id, {}, arrival.event_id)

    def working(self, arrival: Arrival) -> AbstractAsyncContextManager[None]:
        return nullcontext()

    async def say(self, text: str) -> None:
        """One line in, answered (through the pipeline) before it returns. The
        line before it may still be finishing (its inbox entry marked done):
        that write shares its round trip to the store with this line's."""
        payload = {"event_id": uuid.uuid4().hex, "user_id": self.user_id, "text": text}
        arrival = self.arrival_of(payload | {"display_name": self.display_name})
        task = await self.pipeline.take(arrival)
        await self._finished()  # the line before (its errors surface here)
        if task is None:
            return
        self._finishing = task
        answered = asyncio.ensure_future(arrival.answered.wait())
        try:
            await asyncio.wait({task, answered}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            answered.cancel()

    async def _finished(self) -> None:
        task, self._finishing = self._finishing, None
        if task is not None:
            await task

    async def run(self) -> int:
        """Chat until end of input; returns how many messages were sent."""
        sent = 0
        if self.interactive:
            self._note(
                f"Chatting as {self.display_name}. Type a message and press Enter; Ctrl-D (end of input) quits.\n"
            )
            self._note(PROMPT)
        await self.pipeline.recover()  # what a crash cut short, answered first
        async for line in read_lines(self.stdin):
            text = line.strip()
            if text:
                await self.say(text)
                sent += 1
            if self.interactive:
                self._note(PROMPT)
        await self._finished()
        if self.interactive:
            self._note("\n")
        await self.pipeline.close()
        return sent

    def _note(self, text: str) -> None:
        self.stderr.write(text)
        self.stderr.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
