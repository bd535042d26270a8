"""Discord slash commands: `/memory` (what the bot holds on you, item by item,
a "Forget N" button for each; `page:` and `forget: <id>` options), `/checkin`
and `/forget` (everything, or `about:` one topic, after a confirmation with
two buttons).

Both answer ephemerally: only the person who ran the command sees the answer,
so nobody else in a channel learns what the bot remembers about them. Like the
rest of the adapter, the commands only call the bot's port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import discord
from discord import app_commands

from adapters.discord.config import MESSAGE_LIMIT, PLATFORM
from adapters.discord.parse import dm_address
from adapters.splitting import split_message
from bot.forgetting.ledger import PAGE_SIZE, LedgerPage
from bot.ports import BotPort

log = logging.getLogger(__name__)

# A report longer than this many messages is cut: a wall of ephemeral messages helps nobody.
MAX_REPORT_MESSAGES = 5
FORGET_TIMEOUT = 60.0
LEDGER_TIMEOUT = 600.0  # the "Forget N" buttons under /memory
# A /memory button's call on the port: (platform, user id, item id) -> the answer.
Act = Callable[[str, str, str], Coroutine[Any, Any, str]]

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


class LedgerView(discord.ui.View):
    """One "Forget N" button per item of a /memory page that can be forgotten;
    a button acts only for the person who asked (their ephemeral message)."""

    def __init__(self, bot: BotPort, user_id: int, page: LedgerPage, *, timeout: float = LEDGER_TIMEOUT) -> None:
        super().__init__(timeout=timeout)
        self.bot = bot
        self.user_id = user_id
        first = (page.page - 1) * PAGE_SIZE + 1
        for number, item in enumerate(page.items, first):
            if item.id:
                self._button(f"Forget {number}", f"memgpt:forget:{item.id}", bot.forget_memory_item, item.id)
            if item.shareable:
                self._button(f"Share {number}", f"memgpt:share:{item.id}", bot.share_memory_item, item.id)

    def _button(self, label: str, custom_id: str, act: Act, item_id: str) -> None:
        button: discord.ui.Button[LedgerView] = discord.ui.Button(
            label=label, style=discord.ButtonStyle.secondary, custom_id=custom_id[:100]
        )
        button.callback = self._acting(act, item_id)  # type: ignore[method-assign,assignment]
        self.add_item(button)

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return interaction.user.id == self.user_id

    def _acting(self, act: Act, item_id: str) -> Callable[[discord.Interaction], Coroutine[Any, Any, None]]:
        async def press(interaction: discord.Interaction) -> None:
            await interaction.response.defer(ephemeral=True, thinking=True)
            try:
                answer = await act(PLATFORM, str(self.user_id), item_id)
            except Exception:
                log.exception("a /memory button failed for Discord user %s", self.user_id)
                answer = FORGET_FAILED
            await interaction.followup.send(answer, ephemeral=True)

        return press


async def show_memory(
    bot: BotPort, interaction: discord.Interaction, page: int = 1, forget: str = "", share: str = "", search: str = ""
) -> None:
    """`/memory [page] [forget]`: one page of the ledger with its buttons, or one
    item forgotten by id (the text way to a button), only for the person who asked."""
    # The ledger waits until the person's agent is idle (it may be mid-reply), which can take
    # longer than the 3 seconds Discord allows for a first answer: acknowledge first.
    await interaction.response.defer(ephemeral=True, thinking=True)
    user_id = str(interaction.user.id)
    try:
        if search.strip():
            for text in split_message(await bot.search_memory_for(PLATFORM, user_id, search), MESSAGE_LIMIT)[:2]:
                await interaction.followup.send(text, ephemeral=True)
            return
        if forget.strip() or share.strip():
            act, item = (bot.forget_memory_item, forget) if forget.strip() else (bot.share_memory_item, share)
            await interaction.followup.send(await act(PLATFORM, user_id, item.strip()), ephemeral=True)
            return
        ledger = await bot.memory_ledger(PLATFORM, user_id, page)
    except Exception:
        log.exception("memory ledger failed for Discord user %s", interaction.user.id)
        await interaction.followup.send("Sorry, I could not read my memory just now.", ephemeral=True)
        return
    if ledger is None or not ledger.total:
        await interaction.followup.send(NOTHING_HELD, ephemeral=True)
        return
    chunks = report_messages(ledger.text())
    for text in chunks[:-1]:
        await interaction.followup.send(text, ephemeral=True)
    await interaction.followup.send(chunks[-1], ephemeral=True, view=LedgerView(bot, interaction.user.id, ledger))


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
            text = await self.forget()
        except Exception:
            log.exception("forget failed for Discord user %s", self.user_id)
            text = FORGET_FAILED
        await interaction.edit_original_response(content=text)

    async def forget(self) -> str:
        existed = await self.bot.forget_user(PLATFORM, str(self.user_id))
        return FORGET_DONE if existed else FORGET_NOTHING

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


class ForgetAboutView(ForgetView):
    """`/forget about:`: the same two buttons, deleting only what the topic matches."""

    def __init__(self, bot: BotPort, user_id: int, about: str, *, timeout: float = FORGET_TIMEOUT) -> None:
        super().__init__(bot, user_id, timeout=timeout)
        self.about = about
        self.confirm.label = "Delete all of this"  # type: ignore[attr-defined]

    async def forget(self) -> str:
        return await self.bot.forget_memories_about(PLATFORM, str(self.user_id), self.about)


async def ask_to_forget(
    bot: BotPort, interaction: discord.Interaction, *, view_timeout: float = FORGET_TIMEOUT, about: str = ""
) -> ForgetView:
    """`/forget [about]`: ask for confirmation (showing what a topic matches); the view does the rest."""
    if not about.strip():
        view = ForgetView(bot, interaction.user.id, timeout=view_timeout)
        await interaction.response.send_message(FORGET_QUESTION, view=view, ephemeral=True)
        view.question = interaction
        return view
    await interaction.response.defer(ephemeral=True, thinking=True)
    about_view = ForgetAboutView(bot, interaction.user.id, about.strip(), timeout=view_timeout)
    try:
        preview = await bot.preview_forget_about(PLATFORM, str(interaction.user.id), about.strip())
    except Exception:
        log.exception("/forget about failed for Discord user %s", interaction.user.id)
        preview, about_view.outcome = FORGET_FAILED, "failed"
    if preview is None:
        about_view.outcome = "nothing"
        await interaction.followup.send(f"I hold nothing about {about.strip()!r}.", ephemeral=True)
        return about_view
    shown = split_message(preview, MESSAGE_LIMIT)[0]
    await interaction.followup.send(shown, view=about_view, ephemeral=True)
    about_view.question = interaction
    return about_view


def add_commands(tree: app_commands.CommandTree, bot: BotPort, *, forget_timeout: float = FORGET_TIMEOUT) -> None:
    """Register `/memory` and `/forget` on the tree (syncing them is the adapter's job)."""

    @tree.command(name="memory", description="See what I remember about you, item by item (only you see it).")
    @app_commands.describe(
        page="which page of items",
        forget="the id of one item to forget, e.g. passage:12",
        share="the id of a note to let be known everywhere",
        search="words to search your memory for, as I search it",
    )
    @app_commands.allowed_contexts(guilds=True, dms=True, private_channels=False)
    async def memory(
        interaction: discord.Interaction, page: int = 1, forget: str = "", share: str = "", search: str = ""
    ) -> None:
        await show_memory(bot, interaction, page, forget, share, search)

    @tree.command(name="forget", description="Delete what I remember about you, or only about a topic (asks first).")
    @app_commands.describe(about="only what is about this topic, e.g. 'my diagnosis'")
    @app_commands.allowed_contexts(guilds=True, dms=True, private_channels=False)
    async def forget(interaction: discord.Interaction, about: str = "") -> None:
        await ask_to_forget(bot, interaction, view_timeout=forget_timeout, about=about)

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
