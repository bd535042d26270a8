"""Slack's side of the slash commands (bot/commands/ defines them once):
each command's text and each button press become the neutral command, and
its answer becomes Block Kit, sent through the command's `response_url`, so
only the person who typed it sees it (ephemeral).

Every listener acks at once and answers from a task: the work waits for the
person's agent to be idle (and a search may load the embedding model), which
can take longer than the 3 seconds Slack allows, and Bolt acks only once the
listener returns (`process_before_response`). The tasks are this object's,
and `close` waits for them (bounded) before the bot's store closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond

from adapters.slack.api import CALL_ERRORS, error_code
from adapters.slack.config import PLATFORM, REPLY_LIMIT
from adapters.slack.format import escape, markdown_to_mrkdwn
from adapters.slack.listening import SlackListening
from adapters.splitting import split_at_most
from bot.commands.catalog import ACTIONS, COMMANDS, press, run
from bot.commands.model import Answer, Button, Caller
from bot.commands.port import CommandPort

log = logging.getLogger(__name__)

MAX_RESPONSES = 5  # a response_url accepts five messages
SECTION_LIMIT = 3_000  # characters of a section's text, and of a message's text beside blocks
VALUE_LIMIT = 2_000  # characters of a button's value


def action_id(action: str) -> str:
    """A button's Block Kit action_id, from the neutral action's name."""
    return f"memgpt_{action}"


def answer_messages(answer: Answer) -> list[dict[str, Any]]:
    """The answer as response_url messages: a list or a question as Block Kit, else text in chunks."""
    text = markdown_to_mrkdwn(answer.text) if answer.markdown else escape(answer.text)
    if answer.entries:
        blocks = [_section(text)]
        for entry in answer.entries:
            blocks.append(_section(escape(entry.text)))
            if entry.buttons:
                blocks.append(_actions(entry.buttons))
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": escape(answer.footer)}]})
        return [{"text": escape(answer.whole)[:SECTION_LIMIT], "blocks": blocks}]
    if answer.buttons:
        return [{"text": text[:SECTION_LIMIT], "blocks": [_section(text), _actions(answer.buttons)]}]
    return [{"text": chunk} for chunk in split_at_most(text, REPLY_LIMIT, MAX_RESPONSES)]


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[: SECTION_LIMIT - 100]}}


def _actions(buttons: tuple[Button, ...]) -> dict[str, Any]:
    return {"type": "actions", "elements": [_button(button) for button in buttons]}


def _button(button: Button) -> dict[str, Any]:
    element: dict[str, Any] = {
        "type": "button",
        "action_id": action_id(button.action),
        "text": {"type": "plain_text", "text": button.label},
    }
    if button.value:
        element["value"] = button.value[:VALUE_LIMIT]
    if button.danger:
        element["style"] = "danger"
    return element


class SlackCommands:
    """Every command of bot/commands/ and its buttons, on the Bolt app."""

    def __init__(
        self, app: AsyncApp, port: CommandPort, listening: SlackListening, announce: Callable[[str, str], None]
    ) -> None:
        self.port = port
        self.listening = listening
        self.announce = announce  # (channel, text): said there for everyone (the listening notice)
        self._answering: set[asyncio.Task[None]] = set()
        for name in COMMANDS:
            app.command(f"/{name}")(self._on_command)
        for name in ACTIONS:
            app.action(action_id(name))(self._on_press)

    async def _on_command(self, ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        name = str(command.get("command") or "").removeprefix("/")
        user = str(command.get("user_id"))
        # Check-ins go to the person's DM with the bot wherever they were set up: the bot
        # may not be in the channel the command was typed in, and check-ins are private.
        channel = self.listening.channel_of_command(command)
        caller = Caller(
            PLATFORM,
            f"{command.get('team_id')}:{user}",
            {"dm_user": user},
            channel=channel,
            default_mode=self.listening.default(channel.place.id) if channel else "mention",
            manages=lambda: self.listening.manages(user),
        )
        args = COMMANDS[name].parse(str(command.get("text") or ""))
        where = channel.place.id if channel else ""
        self._later(self._answer(respond, run(self.port, name, caller, args), {"response_type": "ephemeral"}, where))

    async def _on_press(self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        """Whoever clicks is acted for, never someone named in the payload's values."""
        await ack()
        clicker = body.get("user") or {}
        team = clicker.get("team_id") or (body.get("team") or {}).get("id")
        caller = Caller(PLATFORM, f"{team}:{clicker.get('id')}", {"dm_user": clicker.get("id")})
        action = (body.get("actions") or [{}])[0]
        name = str(action.get("action_id") or "").removeprefix(action_id(""))
        # A question's buttons answer in its place; a list's answer beside it, the list kept.
        where = (
            {"replace_original": True}
            if ACTIONS[name].closes
            else {"response_type": "ephemeral", "replace_original": False}
        )
        self._later(self._answer(respond, press(self.port, name, caller, str(action.get("value") or "")), where))

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def close(self, grace: float) -> None:
        """Wait at most `grace` seconds for the answers under way, then cancel what is left."""
        if not self._answering:
            return
        _, late = await asyncio.wait(set(self._answering), timeout=grace)
        for task in late:
            task.cancel()
        if late:
            log.warning("slack: %d command answers cut short at shutdown", len(late))
            await asyncio.wait(late)

    async def _answer(
        self,
        respond: AsyncRespond,
        answering: Coroutine[Any, Any, Answer],
        where: dict[str, Any],
        channel: str = "",
    ) -> None:
        """Send the answer to whoever asked; what it announces is said in `channel` for everyone."""
        answer = await answering
        if answer.announce and channel:
            self.announce(channel, answer.announce)
        for message in answer_messages(answer):
            try:
                response = await respond(**message, **where)
            except (*CALL_ERRORS, ValueError) as error:
                log.error("slack: answering a command failed: %s", error_code(error))
                return
            if response.status_code != 200:  # the webhook client reports failures without raising
                log.error("slack: answering a command failed: HTTP %s", response.status_code)
