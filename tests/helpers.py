"""Small helpers several test modules share (one of each)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Sequence
from typing import Any

from bot.events import UserMessage
from memory.queue_manager import STATUS_MARKER
from memory.store import Store
from memory.types import AgentRecord, Block


def stop_process(process: subprocess.Popen[bytes] | None) -> None:
    """Stop a server we started: SIGTERM, then SIGKILL if it has not gone within 10 s."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def new_agent(store: Store, key: str = "discord:alice", blocks: Sequence[Block] | None = None) -> AgentRecord:
    """An agent in `store` (one small `human` block unless `blocks` are given)."""
    agent, _ = await store.get_or_create_agent(key, list(blocks) if blocks is not None else [Block("human", "", 100)])
    return agent


def said(text: str, user: str = "alice") -> UserMessage:
    """A terminal user's message, as the terminal chat builds it (for tests that call the runtime directly)."""
    return UserMessage(platform="terminal", user_id=user, text=text, display_name=user)


def text_of(message: dict[str, Any]) -> str:
    """A request message's text as the model reads it, without the memory status
    that rides after the newest one's text (memory/queue_manager.py with_status)."""
    return str(message.get("content") or "").partition(f"\n{STATUS_MARKER}")[0]


def user_texts(request: dict[str, Any]) -> list[str]:
    """The texts of a request's user messages, oldest first (statuses left out)."""
    return [text_of(m) for m in request["messages"] if m["role"] == "user"]
