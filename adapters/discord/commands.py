"""Discord's side of the slash commands (bot/commands/ defines them once):
each command of the catalogue becomes an application command with its
options, and each answer an ephemeral message (only the person who asked
sees it) with its buttons as a view that acts for that person alone.

Every command is deferred first: the work waits for the person's agent to be
idle, which can take longer than the 3 seconds Discord allows for a first
answer. A question's buttons give up after `forget_timeout` (saying so), a
list's after LIST_TIMEOUT.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import discord
from discord import app_commands

from adapters.discord.config import MESSAGE_LIMIT, PLATFORM
from adapters.discord.listening import DiscordListening
from adapters.discord.parse import dm_address
from adapters.splitting import split_at_most
from bot.commands.catalog import ACTIONS, COMMANDS, press, run
from bot.commands.model import Answer, Button, Caller, SlashCommand
from bot.commands.port import CommandPort

log = logging.getLogger(__name__)

FORGET_TIMEOUT = 60.0  # a question's buttons (/forget)
LIST_TIMEOUT = 600.0  # the buttons under a list (/memory)
Pressed = Callable[[discord.Interaction], Coroutine[Any, Any, None]]


Announce = Callable[[int, str], None]  # (channel id, text): said there for everyone (the listening notice)


def caller_of(interaction: discord.Interaction) -> Caller:
    # Check-ins are delivered to the person's DMs, wherever they set them up.
    user_id = interaction.user.id
    return Caller(PLATFORM, str(user_id), dm_address(user_id, fallback_channel_id=interaction.channel_id))


def caller_in_channel(interaction: discord.Interaction, listening: DiscordListening) -> Caller:
    """The caller with the server channel the command was typed in (its mode, whether they manage it)."""
    caller, channel = caller_of(interaction), interaction.channel
    if interaction.guild_id is None or not isinstance(channel, discord.abc.Messageable):
        return caller
    ref, default = listening.mode_ref(channel, interaction.guild_id)
    manages = listening.manages(interaction)

    async def managing() -> bool:
        return manages

    return replace(caller, channel=ref, default_mode=default, manages=managing)


class AnswerView(discord.ui.View):
    """An answer's buttons (a list's, numbered, then a question's); each acts
    only for the person who asked (their ephemeral message)."""

    def __init__(self, port: CommandPort, user_id: int, answer: Answer, *, timeout: float) -> None:
        super().__init__(timeout=timeout)
        self.port = port
        self.user_id = user_id
        self.expires = answer.expires
        self.question: discord.Interaction | None = None  # to edit its message when the view times out
        for button in answer.all_buttons:
            item: discord.ui.Button[AnswerView] = discord.ui.Button(
                label=button.numbered or button.label,
                style=discord.ButtonStyle.danger if button.danger else discord.ButtonStyle.secondary,
                custom_id=f"memgpt:{button.action}:{button.value}"[:100],
            )
            item.callback = self._pressing(button)  # type: ignore[method-assign,assignment]
            self.add_item(item)

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        # The message is ephemeral, so only its owner can see the buttons; checking costs nothing
        # and keeps a destructive button from ever acting for someone else.
        return interaction.user.id == self.user_id

    def _pressing(self, button: Button) -> Pressed:
        action = ACTIONS[button.action]

        async def pressed(interaction: discord.Interaction) -> None:
            if not action.closes:  # a list's button: the answer comes beside the list
                await interaction.response.defer(ephemeral=True, thinking=True)
                answer = await press(self.port, button.action, caller_of(interaction), button.value)
                await interaction.followup.send(_first(answer), ephemeral=True)
                return
            self.stop()  # the question is answered: drop its buttons, so nobody presses twice
            if not action.working:
                answer = await press(self.port, button.action, caller_of(interaction), button.value)
                await interaction.response.edit_message(content=_first(answer), view=None)
                return
            # Say so at once: the work waits for the agent to be idle and may outlast Discord's 3 seconds.
            await interaction.response.edit_message(content=action.working, view=None)
            answer = await press(self.port, button.action, caller_of(interaction), button.value)
            await interaction.edit_original_response(content=_first(answer))

        return pressed

    async def on_timeout(self) -> None:
        if not self.expires or self.question is None:
            return
        try:
            await self.question.edit_original_response(content=self.expires, view=None)
        except discord.HTTPException as error:  # the token lives 15 minutes; the message may be gone
            log.info("could not mark a question as unanswered: %s", error)


def _first(answer: Answer) -> str:
    return split_at_most(answer.whole, MESSAGE_LIMIT, 1)[0]


async def send_answer(
    port: CommandPort, interaction: discord.Interaction, answer: Answer, *, forget_timeout: float = FORGET_TIMEOUT
) -> None:
    """Send the answer to a deferred interaction: its text in messages, the buttons under the last."""
    *chunks, last = split_at_most(answer.whole, MESSAGE_LIMIT)
    for text in chunks:
        await interaction.followup.send(text, ephemeral=True)
    if not answer.all_buttons:
        await interaction.followup.send(last, ephemeral=True)
        return
    view = AnswerView(port, interaction.user.id, answer, timeout=forget_timeout if answer.expires else LIST_TIMEOUT)
    await interaction.followup.send(last, ephemeral=True, view=view)
    view.question = interaction


def slash_command(
    command: SlashCommand,
    port: CommandPort,
    listening: DiscordListening,
    announce: Announce,
    *,
    forget_timeout: float = FORGET_TIMEOUT,
) -> app_commands.Command[Any, ..., None]:
    """The application command for one command of the catalogue, its options typed by their defaults."""

    async def callback(interaction: discord.Interaction, **options: str | int) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        given = {name: value for name, value in options.items() if value != command.option(name).default}
        answer = await run(port, command.name, caller_in_channel(interaction, listening), given)
        if answer.announce and interaction.channel_id is not None:
            announce(interaction.channel_id, answer.announce)
        await send_answer(port, interaction, answer, forget_timeout=forget_timeout)

    # discord.py reads the options from the callback's signature: give it one per option.
    parameters = [
        inspect.Parameter("interaction", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=discord.Interaction)
    ]
    parameters += [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=type(o.default))
        for o in command.options
    ]
    setattr(callback, "__signature__", inspect.Signature(parameters))  # noqa: B010
    app_commands.describe(**{o.name: o.description for o in command.options})(callback)
    app_commands.allowed_contexts(guilds=True, dms=True, private_channels=False)(callback)
    return app_commands.Command(name=command.name, description=command.description, callback=callback)


def add_commands(
    tree: app_commands.CommandTree,
    port: CommandPort,
    listening: DiscordListening,
    announce: Announce,
    *,
    forget_timeout: float = FORGET_TIMEOUT,
) -> None:
    """Register every command of the catalogue on the tree (syncing them is the adapter's job)."""
    for command in COMMANDS.values():
        tree.add_command(slash_command(command, port, listening, announce, forget_timeout=forget_timeout))
