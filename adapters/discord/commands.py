"""Discord slash commands: `/memory` (what the bot holds on you), `/checkin` and `/forget`
(delete it, after a confirmation with two buttons).

Both answer ephemerally: only the person who ran the command sees the answer,
so nobody else in a channel learns what the bot remembers about them. Like the
rest of the adapter, the commands only call the bot's port.
"""

from __future__ import annotations

import logging

import discord
from discord import app_commands

from adapters.discord.config import MESSAGE_LIMIT, PLATFORM
from adapters.discord.parse import dm_address
from adapters.splitting import split_message
from bot.ports import BotPort

log = logging.getLogger(__name__)

# A report longer than this many messages is cut: a wall of ephemeral messages helps nobody.
MAX_REPORT_MESSAGES = 5
FORGET_TIMEOUT = 60.0

NOTHING_HELD = "I hold nothing on you."
TRUNCATED = "\n… (cut short: there is more than fits here)"
FORGET_QUESTION = (
    "Delete everything I remember about you: our conversation history, what I noted about you, "
    "and the files you shared? This cannot be undone."
)
FORGET_WORKING = "Deleting everything I hold on you…"
FORGET_DONE = "Done: I deleted everything I held on you. If we talk again, I start from scratch."
FORGET_NOTHING = "Done: I held nothing on you."
FORGET_FAILED = "Sorry, deleting failed on my side; nothing may have been deleted. Please try again later."
FORGET_CANCELLED = "Cancelled: nothing was deleted."
FORGET_TIMED_OUT = "No answer within a minute, so nothing was deleted."


def report_messages(report: str | None) -> list[str]:
    """The `/memory` answer as Discord messages: split at the limit, at most MAX_REPORT_MESSAGES."""
    if not report or not report.strip():
        return [NOTHING_HELD]
    chunks = split_message(report, MESSAGE_LIMIT)
    if len(chunks) <= MAX_REPORT_MESSAGES:
        return chunks
    kept = chunks[:MAX_REPORT_MESSAGES]
    # Re-split the last kept chunk so the note fits without cutting through a code fence.
    kept[-1] = split_message(kept[-1], MESSAGE_LIMIT - len(TRUNCATED))[0] + TRUNCATED
    return kept


async def show_memory(bot: BotPort, interaction: discord.Interaction) -> None:
    """`/memory`: the report, only for the person who asked."""
    # The report waits until the person's agent is idle (it may be mid-reply), which can take
    # longer than the 3 seconds Discord allows for a first answer: acknowledge first.
    await interaction.response.defer(ephemeral=True, thinking=True)
    try:
        report = await bot.memory_report(PLATFORM, str(interaction.user.id))
    except Exception:
        log.exception("memory report failed for Discord user %s", interaction.user.id)
        await interaction.followup.send("Sorry, I could not read my memory just now.", ephemeral=True)
        return
    for text in report_messages(report):
        await interaction.followup.send(text, ephemeral=True)


class ForgetView(discord.ui.View):
    """The two buttons under the `/forget` question. Nothing is deleted unless the
    person who asked presses "Delete everything" before the timeout."""

    def __init__(self, bot: BotPort, user_id: int, *, timeout: float = FORGET_TIMEOUT) -> None:
        super().__init__(timeout=timeout)
        self.bot = bot
        self.user_id = user_id
        # The /forget interaction, to edit its message when the view times out.
        self.question: discord.Interaction | None = None
        self.outcome = "pending"

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        # The message is ephemeral, so only its owner can see the buttons; checking costs nothing
        # and keeps a destructive button from ever acting for someone else.
        return interaction.user.id == self.user_id

    @discord.ui.button(label="Delete everything", style=discord.ButtonStyle.danger)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button[ForgetView]) -> None:
        self.stop()
        self.outcome = "confirmed"
        # Answer at once (and drop the buttons, so nobody presses twice): forgetting waits for the
        # agent to be idle and may take longer than Discord's 3 seconds.
        await interaction.response.edit_message(content=FORGET_WORKING, view=None)
        try:
            existed = await self.bot.forget_user(PLATFORM, str(self.user_id))
        except Exception:
            log.exception("forget failed for Discord user %s", self.user_id)
            text = FORGET_FAILED
        else:
            text = FORGET_DONE if existed else FORGET_NOTHING
        await interaction.edit_original_response(content=text)

    @discord.ui.button(label="Cancel", style=discord.ButtonStyle.secondary)
    async def cancel(self, interaction: discord.Interaction, button: discord.ui.Button[ForgetView]) -> None:
        self.stop()
        self.outcome = "cancelled"
        await interaction.response.edit_message(content=FORGET_CANCELLED, view=None)

    async def on_timeout(self) -> None:
        self.outcome = "timed out"
        if self.question is None:
            return
        try:
            await self.question.edit_original_response(content=FORGET_TIMED_OUT, view=None)
        except discord.HTTPException as error:  # the token lives 15 minutes; the message may be gone
            log.info("could not mark the /forget question as timed out: %s", error)


async def ask_to_forget(
    bot: BotPort, interaction: discord.Interaction, *, view_timeout: float = FORGET_TIMEOUT
) -> ForgetView:
    """`/forget`: ask for confirmation; the view does the rest."""
    view = ForgetView(bot, interaction.user.id, timeout=view_timeout)
    await interaction.response.send_message(FORGET_QUESTION, view=view, ephemeral=True)
    view.question = interaction
    return view


def add_commands(tree: app_commands.CommandTree, bot: BotPort, *, forget_timeout: float = FORGET_TIMEOUT) -> None:
    """Register `/memory` and `/forget` on the tree (syncing them is the adapter's job)."""

    @tree.command(name="memory", description="See what I remember about you (only you see the answer).")
    @app_commands.allowed_contexts(guilds=True, dms=True, private_channels=False)
    async def memory(interaction: discord.Interaction) -> None:
        await show_memory(bot, interaction)

    @tree.command(name="forget", description="Delete everything I remember about you (asks first).")
    @app_commands.allowed_contexts(guilds=True, dms=True, private_channels=False)
    async def forget(interaction: discord.Interaction) -> None:
        await ask_to_forget(bot, interaction, view_timeout=forget_timeout)

    @tree.command(name="checkin", description="Scheduled check-ins: daily 09:00, weekly mon 18:30, every 4h, list…")
    @app_commands.describe(command="e.g. 'daily 09:00', 'tz Europe/Paris', 'quiet 22:00-07:00', 'list', 'help'")
    @app_commands.allowed_contexts(guilds=True, dms=True, private_channels=False)
    async def checkin(interaction: discord.Interaction, command: str = "help") -> None:
        await run_checkin(bot, interaction, command)


async def run_checkin(bot: BotPort, interaction: discord.Interaction, command: str) -> None:
    """`/checkin ...`: check-ins are delivered to the person's DMs, wherever they set them up."""
    await interaction.response.defer(ephemeral=True, thinking=True)
    user_id = interaction.user.id
    reply_to = dm_address(user_id, fallback_channel_id=interaction.channel_id)
    try:
        answer = await bot.checkin_command(PLATFORM, str(user_id), command, reply_to)
    except Exception:
        log.exception("/checkin failed for Discord user %s", user_id)
        answer = "Sorry, I could not change your check-ins just now. Please try again later."
    for text in split_message(answer, MESSAGE_LIMIT):
        await interaction.followup.send(text, ephemeral=True)
