"""The terminal chat adapter: standard input in, the agent's replies out.

Each non-empty input line becomes one `UserMessage`; each reply text is printed
on its own line to standard output and flushed at once. At a terminal a short
banner and a `you> ` prompt go to standard error, so that standard output only
ever carries the replies and the adapter is as scriptable through a pipe as it
is usable by hand. End of input ends the chat.

Like every adapter it knows nothing of memory: it builds events and calls the
`handle` it is given (the runtime's `handle`).
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TextIO

from bot.events import Reply, UserMessage

PLATFORM = "terminal"
PROMPT = "you> "

Handle = Callable[[UserMessage], Awaitable[list[Reply]]]


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

    def __init__(
        self,
        handle: Handle,
        user_id: str,
        *,
        platform: str = PLATFORM,
        display_name: str | None = None,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        interactive: bool | None = None,
    ) -> None:
        self.handle = handle
        self.platform = platform
        self.user_id = user_id
        self.display_name = display_name or user_id
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.interactive = _isatty(self.stdin) if interactive is None else interactive

    def event(self, text: str) -> UserMessage:
        return UserMessage(
            platform=self.platform,
            user_id=self.user_id,
            text=text,
            display_name=self.display_name,
            channel="terminal",
        )

    async def run(self) -> int:
        """Chat until end of input; returns how many messages were sent."""
        sent = 0
        if self.interactive:
            self._note(
                f"Chatting as {self.display_name}. Type a message and press Enter; Ctrl-D (end of input) quits.\n"
            )
            self._note(PROMPT)
        async for line in read_lines(self.stdin):
            text = line.strip()
            if text:
                replies = await self.handle(self.event(text))
                sent += 1
                for reply in replies:
                    self.stdout.write(reply.text + "\n")
                    self.stdout.flush()
            if self.interactive:
                self._note(PROMPT)
        if self.interactive:
            self._note("\n")
        return sent

    def _note(self, text: str) -> None:
        self.stderr.write(text)
        self.stderr.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


async def chat(handle: Handle, user_id: str, *, platform: str = PLATFORM, display_name: str | None = None) -> int:
    """Chat on this process's standard streams; returns how many messages were sent."""
    if isinstance(sys.stdin, io.TextIOWrapper):
        # Bytes that are not UTF-8 become U+FFFD, as on the other platforms:
        # "strict" would end the chat, the C locale's "surrogateescape" would
        # pass lone surrogates on (bot/sanitize.py catches those too).
        sys.stdin.reconfigure(errors="replace")
    return await TerminalChat(handle, user_id, platform=platform, display_name=display_name).run()
