"""Slack slash commands: `/memory` (what the bot holds on you), `/forget`
(delete it, after a confirmation with two Block Kit buttons) and `/checkin`
(scheduled check-ins, when the bot offers them).

Every answer is ephemeral and goes through the command's `response_url`, so
only the person who typed the command sees it. Each handler acks at once: the
report or the deletion waits for the person's agent to be idle, which can take
longer than the 3 seconds Slack allows. Like the rest of the adapter, the
commands only call the bot's port.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond

from adapters.slack.api import CALL_ERRORS, error_code
from adapters.slack.config import PLATFORM, REPLY_LIMIT
from adapters.slack.format import escape, markdown_to_mrkdwn
from adapters.splitting import split_message
from bot.ports import BotPort

log = logging.getLogger(__name__)

MAX_RESPONSES = 5  # a response_url accepts five messages
FORGET_CONFIRM = "memgpt_forget_confirm"
FORGET_CANCEL = "memgpt_forget_cancel"

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


def add_commands(app: AsyncApp, bot: BotPort) -> None:
    """Register `/memory`, `/forget` and the two buttons on the Bolt app."""

    async def memory(ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        user_id = f"{command.get('team_id')}:{command.get('user_id')}"
        try:
            report = await bot.memory_report(PLATFORM, user_id)
        except Exception:
            log.exception("slack: /memory failed for %s", user_id)
            await _respond(respond, text=MEMORY_FAILED, response_type="ephemeral")
            return
        for text in report_messages(report):
            await _respond(respond, text=text, response_type="ephemeral")

    async def forget(ack: AsyncAck, respond: AsyncRespond) -> None:
        await ack()
        await _respond(
            respond, text="Forget everything I know about you?", blocks=forget_blocks(), response_type="ephemeral"
        )

    async def confirm(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        # Whoever clicks is forgotten, never someone named in the payload's values.
        clicker = body.get("user") or {}
        team = clicker.get("team_id") or (body.get("team") or {}).get("id")
        user_id = f"{team}:{clicker.get('id')}"
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
    if callable(getattr(bot, "checkin_command", None)):  # a bot without check-ins leaves the command unanswered
        app.command("/checkin")(checkin)


async def _respond(respond: AsyncRespond, **message: Any) -> None:
    try:
        response = await respond(**message)
    except (*CALL_ERRORS, ValueError) as error:
        log.error("slack: answering a command failed: %s", error_code(error))
        return
    if response.status_code != 200:  # the webhook client reports failures without raising
        log.error("slack: answering a command failed: HTTP %s", response.status_code)
