"""Slack slash commands: `/memory` (what the bot holds on you, item by item,
each with a "Forget this" Block Kit button; `/memory page N`, `/memory forget
<id>`), `/forget` (everything, or `/forget about: <words>` for one topic,
after a confirmation with two buttons) and `/checkin` (scheduled check-ins,
when the bot offers them).

Every answer is ephemeral and goes through the command's `response_url`, so
only the person who typed the command sees it. Each handler acks at once: the
report or the deletion waits for the person's agent to be idle, which can take
longer than the 3 seconds Slack allows. Like the rest of the adapter, the
commands only call the bot's port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond

from adapters.slack.api import CALL_ERRORS, error_code
from adapters.slack.config import PLATFORM, REPLY_LIMIT
from adapters.slack.format import escape, markdown_to_mrkdwn
from adapters.splitting import split_message
from bot.forgetting.ledger import PAGE_SIZE, LedgerPage
from bot.ports import BotPort

log = logging.getLogger(__name__)

MAX_RESPONSES = 5  # a response_url accepts five messages
FORGET_CONFIRM = "memgpt_forget_confirm"
FORGET_CANCEL = "memgpt_forget_cancel"
FORGET_ITEM = "memgpt_forget_item"  # a "Forget this" button under /memory; its value is the item id
SHARE_ITEM = "memgpt_share_item"  # "Share everywhere" under a note of /memory
FORGET_ABOUT = "memgpt_forget_about"  # the confirm button of /forget about:; its value is the topic

NOTHING_HELD = "I don't hold anything about you yet."
MEMORY_FAILED = "Sorry, I couldn't read my memory just now. Please try again later."
TRUNCATED = "\n… (cut short: there is more than fits here)"
FORGET_QUESTION = (
    "*Forget everything I know about you?* This deletes our conversation history, what I noted "
    "about you and the files you shared with me. It cannot be undone."
)
FORGET_DONE = "Done: I have forgotten everything I knew about you. If we talk again, I start from scratch."
FORGET_NOTHING = "Done: I held nothing on you."
FORGET_FAILED = "Sorry, deleting failed on my side; nothing may have been deleted. Please try again later."
FORGET_CANCELLED = "Cancelled: nothing was deleted."
CHECKIN_FAILED = "Sorry, I could not change your check-ins just now. Please try again later."


def report_messages(report: str | None) -> list[str]:
    """The `/memory` answer as mrkdwn messages: a code block (the report is laid out
    with spaces), split at the limit, at most MAX_RESPONSES."""
    if not report or not report.strip():
        return [NOTHING_HELD]
    fenced = escape(report).replace("```", "`\u200b``")  # a fence in the person's notes would end the block
    chunks = split_message(f"```\n{fenced}\n```", REPLY_LIMIT)
    if len(chunks) > MAX_RESPONSES:
        chunks = chunks[:MAX_RESPONSES]
        chunks[-1] += TRUNCATED
    return chunks


def forget_blocks() -> list[dict[str, Any]]:
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": FORGET_QUESTION}},
        {
            "type": "actions",
            "block_id": "memgpt_forget",
            "elements": [
                {
                    "type": "button",
                    "action_id": FORGET_CONFIRM,
                    "style": "danger",
                    "value": "forget",
                    "text": {"type": "plain_text", "text": "Forget me"},
                },
                {
                    "type": "button",
                    "action_id": FORGET_CANCEL,
                    "value": "cancel",
                    "text": {"type": "plain_text", "text": "Cancel"},
                },
            ],
        },
    ]


def ledger_blocks(page: LedgerPage) -> list[dict[str, Any]]:
    """One section per item, with a "Forget this" button for each that can be forgotten."""
    lines = page.text().splitlines()
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": escape(lines[0])}}]
    first = (page.page - 1) * PAGE_SIZE + 1
    for number, item in enumerate(page.items, first):
        block: dict[str, Any] = {"type": "section", "text": {"type": "mrkdwn", "text": escape(item.line(number))}}
        blocks.append(block)
        buttons = [_button(FORGET_ITEM, item.id, "Forget this")] if item.id else []
        if item.shareable:
            buttons.append(_button(SHARE_ITEM, item.id, "Share everywhere"))
        if buttons:
            blocks.append({"type": "actions", "elements": buttons})
    footer = "\n".join(line for line in lines[len(page.items) + 1 :] if line)
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": escape(footer)}]})
    return blocks


def _button(action_id: str, value: str, text: str) -> dict[str, Any]:
    return {"type": "button", "action_id": action_id, "value": value, "text": {"type": "plain_text", "text": text}}


def forget_about_blocks(preview: str, about: str) -> list[dict[str, Any]]:
    text = escape(preview)[:2900]
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {
            "type": "actions",
            "block_id": "memgpt_forget_about",
            "elements": [
                {
                    "type": "button",
                    "action_id": FORGET_ABOUT,
                    "style": "danger",
                    "value": about[:2000],
                    "text": {"type": "plain_text", "text": "Forget all of this"},
                },
                {
                    "type": "button",
                    "action_id": FORGET_CANCEL,
                    "value": "cancel",
                    "text": {"type": "plain_text", "text": "Cancel"},
                },
            ],
        },
    ]


def _clicker(body: dict[str, Any]) -> str:
    """Whoever clicks is acted for, never someone named in the payload's values."""
    clicker = body.get("user") or {}
    team = clicker.get("team_id") or (body.get("team") or {}).get("id")
    return f"{team}:{clicker.get('id')}"


def _about(text: str) -> str:
    """The topic of `/forget about: <words>` ("about:" optional); "" for a bare /forget."""
    text = text.strip()
    return text[len("about:") :].strip() if text.lower().startswith("about:") else text


def add_commands(app: AsyncApp, bot: BotPort) -> None:
    """Register `/memory`, `/forget` and the two buttons on the Bolt app."""

    async def memory(ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        """`/memory`, `/memory page N`, `/memory search <words>`, `/memory forget|share <id>`."""
        await ack()
        user_id = f"{command.get('team_id')}:{command.get('user_id')}"
        verb, _, rest = str(command.get("text") or "").strip().partition(" ")
        try:
            if verb.lower() == "search":
                _later(search(user_id, rest, respond))
                return
            if verb.lower() in ("forget", "share") and rest.strip():
                act = bot.forget_memory_item if verb.lower() == "forget" else bot.share_memory_item
                answer = await act(PLATFORM, user_id, rest.strip())
                await _respond(respond, text=escape(answer), response_type="ephemeral")
                return
            number = int(rest) if verb.lower() == "page" and rest.strip().isdecimal() else 1
            page = await bot.memory_ledger(PLATFORM, user_id, number)
        except Exception:
            log.exception("slack: /memory failed for %s", user_id)
            await _respond(respond, text=MEMORY_FAILED, response_type="ephemeral")
            return
        if page is None or not page.total:
            await _respond(respond, text=NOTHING_HELD, response_type="ephemeral")
            return
        await _respond(respond, text=page.text()[:3000], blocks=ledger_blocks(page), response_type="ephemeral")

    async def forget(ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        about = _about(str(command.get("text") or ""))
        if not about:
            await _respond(
                respond, text="Forget everything I know about you?", blocks=forget_blocks(), response_type="ephemeral"
            )
            return
        user_id = f"{command.get('team_id')}:{command.get('user_id')}"
        # Searching may load the embedding model: the answer goes through response_url, after the ack.
        _later(preview(user_id, about, respond))

    async def preview(user_id: str, about: str, respond: AsyncRespond) -> None:
        try:
            preview = await bot.preview_forget_about(PLATFORM, user_id, about)
        except Exception:
            log.exception("slack: /forget about failed for %s", user_id)
            await _respond(respond, text=MEMORY_FAILED, response_type="ephemeral")
            return
        if preview is None:
            await _respond(respond, text=f"I hold nothing about {escape(about)}.", response_type="ephemeral")
            return
        blocks = forget_about_blocks(preview, about)
        await _respond(respond, text=escape(preview)[:3000], blocks=blocks, response_type="ephemeral")

    async def search(user_id: str, query: str, respond: AsyncRespond) -> None:
        try:
            answer = await bot.search_memory_for(PLATFORM, user_id, query)
        except Exception:
            log.exception("slack: /memory search failed for %s", user_id)
            answer = MEMORY_FAILED
        await _respond(respond, text=escape(answer)[:3000], response_type="ephemeral")

    def item_button(act: Callable[[str, str, str], Awaitable[str]]) -> Callable[..., Awaitable[None]]:
        """A /memory button ("Forget this", "Share everywhere"): its value is the item id,
        the clicker is whose memory it acts on; the answer is a new ephemeral message."""

        async def press(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
            await ack()
            user_id = _clicker(body)
            item = str(((body.get("actions") or [{}])[0]).get("value") or "")
            try:
                answer = await act(PLATFORM, user_id, item)
            except Exception:
                log.exception("slack: a /memory button failed for %s", user_id)
                answer = MEMORY_FAILED
            await _respond(respond, text=escape(answer), response_type="ephemeral", replace_original=False)

        return press

    async def forget_about(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        _later(forget_topic(_clicker(body), str(((body.get("actions") or [{}])[0]).get("value") or ""), respond))

    async def forget_topic(user_id: str, about: str, respond: AsyncRespond) -> None:
        try:
            answer = await bot.forget_memories_about(PLATFORM, user_id, about)
        except Exception:
            log.exception("slack: /forget about failed for %s", user_id)
            answer = FORGET_FAILED
        await _respond(respond, text=escape(answer), replace_original=True)

    async def confirm(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        user_id = _clicker(body)
        try:
            forgotten = await bot.forget_user(PLATFORM, user_id)
        except Exception:
            log.exception("slack: /forget failed for %s", user_id)
            await _respond(respond, text=FORGET_FAILED, replace_original=True)
            return
        await _respond(respond, text=FORGET_DONE if forgotten else FORGET_NOTHING, replace_original=True)

    async def cancel(ack: AsyncAck, respond: AsyncRespond) -> None:
        await ack()
        await _respond(respond, text=FORGET_CANCELLED, replace_original=True)

    async def checkin(ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        user = str(command.get("user_id"))
        user_id = f"{command.get('team_id')}:{user}"
        # Check-ins go to the person's DM with the bot wherever they were set up: the bot
        # may not be in the channel the command was typed in, and check-ins are private.
        try:
            answer = await bot.checkin_command(
                PLATFORM, user_id, str(command.get("text") or "").strip() or "help", {"dm_user": user}
            )
        except Exception:
            log.exception("slack: /checkin failed for %s", user_id)
            answer = CHECKIN_FAILED
        for text in split_message(markdown_to_mrkdwn(answer), REPLY_LIMIT)[:MAX_RESPONSES]:
            await _respond(respond, text=text, response_type="ephemeral")

    app.command("/memory")(memory)
    app.command("/forget")(forget)
    app.action(FORGET_CONFIRM)(confirm)
    app.action(FORGET_CANCEL)(cancel)
    app.action(FORGET_ITEM)(item_button(bot.forget_memory_item))
    app.action(SHARE_ITEM)(item_button(bot.share_memory_item))
    app.action(FORGET_ABOUT)(forget_about)
    if callable(getattr(bot, "checkin_command", None)):  # a bot without check-ins leaves the command unanswered
        app.command("/checkin")(checkin)


# Slash-command work that may outlast Slack's 3 seconds (a search, a selective forget),
# answered through response_url once done; held here so it is not collected mid-way.
_background: set[asyncio.Task[None]] = set()


def _later(work: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(work)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _respond(respond: AsyncRespond, **message: Any) -> None:
    try:
        response = await respond(**message)
    except (*CALL_ERRORS, ValueError) as error:
        log.error("slack: answering a command failed: %s", error_code(error))
        return
    if response.status_code != 200:  # the webhook client reports failures without raising
        log.error("slack: answering a command failed: HTTP %s", response.status_code)
