"""The slash commands, each defined once: `/memory` (the ledger, item by item,
with a button to forget each and to share a note; `page`, `search`, `forget`,
`share`, and `channels on|off|show`: what channel memories may keep of them),
`/forget` (everything, or `about` one topic, after a question with two
buttons), `/checkin` (scheduled check-ins) and `/channel` (a channel's mode,
bot/channels/), with every string they show. The platforms parse into these
and render what they answer."""

from __future__ import annotations

import logging

from bot.channels.port import MODES, Mode
from bot.commands.model import Action, Answer, Args, Button, Caller, Entry, Option, SlashCommand
from bot.commands.port import CommandPort
from bot.forgetting.ledger import PAGE_SIZE, LedgerPage, UnknownItem, describe_found

log = logging.getLogger(__name__)

NOTHING_HELD = "I hold nothing on you."
MEMORY_FAILED = "Sorry, I couldn't read my memory just now. Please try again later."
FORGET_QUESTION = (
    "**Forget everything I know about you?** This deletes our conversation history, what I noted "
    "about you, the files you shared with me, and what channels kept of what you said there. "
    "It cannot be undone. (If you turned channel memory off, it stays off.)"
)
FORGET_WORKING = "Deleting everything I hold on you…"
FORGET_ABOUT_WORKING = "Deleting all of this…"
FORGET_DONE = "Done: I have forgotten everything I knew about you. If we talk again, I start from scratch."
FORGET_NOTHING = "Done: I held nothing on you."
FORGET_FAILED = "Sorry, deleting failed on my side; nothing may have been deleted. Please try again later."
FORGET_CANCELLED = "Cancelled: nothing was deleted."
FORGET_TIMED_OUT = "No answer within a minute, so nothing was deleted."
CHECKIN_FAILED = "Sorry, I could not change your check-ins just now. Please try again later."

CANCEL = Button("forget_cancel", "", "Cancel")


# -- /memory -------------------------------------------------------------------
async def memory(port: CommandPort, caller: Caller, args: Args) -> Answer:
    if "search" in args:
        return Answer(await port.search_memory(caller.key, str(args["search"])))
    if "channels" in args:  # "on", "off", or "show" ("", where a platform can send it: Slack)
        choice = str(args["channels"]).strip()
        return Answer(await port.channel_setting(caller.key, "" if choice.lower() == "show" else choice))
    for verb in ("forget", "share"):
        item = str(args.get(verb, "")).strip()
        if item:  # the text way to a button
            return Answer(await ACTIONS[f"{verb}_item"].act(port, caller, item))
    page = await port.ledger(caller.key, int(args.get("page", 1)))
    return ledger_answer(page) if page is not None and page.total else Answer(NOTHING_HELD)


def ledger_answer(page: LedgerPage) -> Answer:
    """One entry per item, with "Forget" for each that can be forgotten and "Share" for a note kept to some places."""
    entries = []
    for number, item in enumerate(page.items, (page.page - 1) * PAGE_SIZE + 1):
        buttons = [Button("forget_item", item.id, "Forget this", f"Forget {number}")] if item.id else []
        if item.shareable:
            buttons.append(Button("share_item", item.id, "Share everywhere", f"Share {number}"))
        entries.append(Entry(item.line(number), tuple(buttons)))
    lines = page.text().splitlines()
    footer = "\n".join(line for line in lines[len(entries) + 1 :] if line)
    return Answer(lines[0], entries=tuple(entries), footer=footer)


# -- /forget -------------------------------------------------------------------
async def forget(port: CommandPort, caller: Caller, args: Args) -> Answer:
    about = str(args.get("about", "")).strip()
    if not about:
        confirm = Button("forget_confirm", "", "Delete everything", danger=True)
        return Answer(FORGET_QUESTION, markdown=True, buttons=(confirm, CANCEL), expires=FORGET_TIMED_OUT)
    found = await port.preview_forget(caller.key, about)
    if found.empty:
        return Answer(f"I hold nothing about {about!r}.")
    confirm = Button("forget_about", about, "Delete all of this", danger=True)
    return Answer(describe_found(found), buttons=(confirm, CANCEL), expires=FORGET_TIMED_OUT)


async def forget_item(port: CommandPort, caller: Caller, item: str) -> str:
    try:
        return (await port.forget_one(caller.key, item)).text()
    except UnknownItem as error:
        return str(error)


async def forget_about(port: CommandPort, caller: Caller, about: str) -> str:
    return (await port.forget_topic(caller.key, about)).text()


async def forget_everything(port: CommandPort, caller: Caller, value: str) -> str:
    return FORGET_DONE if await port.forget(caller.key) else FORGET_NOTHING


async def cancel(port: CommandPort, caller: Caller, value: str) -> str:
    return FORGET_CANCELLED


# -- /checkin (bot/checkins/commands.py does the work) --------------------------
async def checkin(port: CommandPort, caller: Caller, args: Args) -> Answer:
    text = str(args.get("command", "")).strip() or "help"
    return Answer(await port.checkin_command(caller.platform, caller.user_id, text, caller.reply_to), markdown=True)


# -- /channel (bot/channels/: the mode is stored, the notice said once) ------------
CHANNEL_FAILED = "Sorry, I could not read or change this channel's mode just now. Please try again later."
CHANNEL_IN_DM = (
    "`/channel` works in a channel: type it there to see whether I keep what is said in it, "
    "and, if you manage the channel, to change that."
)
CHANNEL_MODES: dict[Mode, str] = {
    "mention": "This channel is in **mention** mode: I answer only when mentioned, and keep nothing else said here.",
    "listen": (
        "This channel is in **listen** mode: I keep what is said here, for this channel only, so members "
        "can ask me about it here later, and I answer only when mentioned. Keeping makes no AI call. "
        "Anyone can keep their own messages out with `/memory channels off`."
    ),
    "open": (
        "This channel is in **open** mode: I answer every message here, and keep what is said, for this "
        "channel only. Anyone can keep their own messages out with `/memory channels off`."
    ),
}
CHANNEL_HOW = "People who manage the channel can change it: `/channel listen`, `/channel open` or `/channel mention`."
CHANNEL_NOT_MANAGER = "Only people who manage this channel can change its mode; it stays as it is."
CHANNEL_UNKNOWN = "The modes are `listen`, `open` and `mention`; `/channel` alone shows this channel's."
CHANNEL_SET = "Done. "


async def channel(port: CommandPort, caller: Caller, args: Args) -> Answer:
    where = caller.channel
    if where is None:
        return Answer(CHANNEL_IN_DM, markdown=True)
    wanted = str(args.get("mode", "")).strip().lower()
    if not wanted:
        mode = await port.channel_mode(where, caller.default_mode)
        return Answer(f"{CHANNEL_MODES[mode]}\n\n{CHANNEL_HOW}", markdown=True)
    chosen = next((mode for mode in MODES if mode == wanted), None)
    if chosen is None:
        return Answer(CHANNEL_UNKNOWN, markdown=True)
    if caller.manages is None or not await caller.manages():
        return Answer(CHANNEL_NOT_MANAGER)
    notice = await port.set_channel_mode(where, chosen)
    return Answer(CHANNEL_SET + CHANNEL_MODES[chosen], markdown=True, announce=notice)


COMMANDS: dict[str, SlashCommand] = {
    command.name: command
    for command in (
        SlashCommand(
            "memory",
            "See what I remember about you, item by item (only you see it).",
            memory,
            MEMORY_FAILED,
            (
                Option("page", "which page of items", 1),
                Option("forget", "the id of one item to forget, e.g. passage:12"),
                Option("share", "the id of a note to let be known everywhere"),
                Option("search", "words to search your memory for, as I search it"),
                Option("channels", "off: channels keep nothing you say (and forget it); on: they may; show"),
            ),
        ),
        SlashCommand(
            "forget",
            "Delete what I remember about you, or only about a topic (asks first).",
            forget,
            MEMORY_FAILED,
            (Option("about", "only what is about this topic, e.g. 'my diagnosis'"),),
            rest="about",
        ),
        SlashCommand(
            "checkin",
            "Scheduled check-ins: daily 09:00, weekly mon 18:30, every 4h, list…",
            checkin,
            CHECKIN_FAILED,
            (Option("command", "e.g. 'daily 09:00', 'tz Europe/Paris', 'quiet 22:00-07:00', 'list', 'help'", "help"),),
            rest="command",
        ),
        SlashCommand(
            "channel",
            "Whether I keep what this channel says; who manages it can change that.",
            channel,
            CHANNEL_FAILED,
            (Option("mode", "listen, open or mention (only for who manages the channel); empty: show it"),),
            rest="mode",
        ),
    )
}

# The buttons' actions, by the name a Button carries.
ACTIONS: dict[str, Action] = {
    "forget_item": Action(forget_item, FORGET_FAILED),
    "share_item": Action(lambda port, caller, item: port.share_note(caller.key, item), MEMORY_FAILED),
    "forget_confirm": Action(forget_everything, FORGET_FAILED, closes=True, working=FORGET_WORKING),
    "forget_about": Action(forget_about, FORGET_FAILED, closes=True, working=FORGET_ABOUT_WORKING),
    "forget_cancel": Action(cancel, FORGET_FAILED, closes=True),
}


async def run(port: CommandPort, name: str, caller: Caller, args: Args) -> Answer:
    """The answer to `/name` with these options; the command's apology when the bot fails."""
    command = COMMANDS[name]
    try:
        return await command.run(port, caller, args)
    except Exception:
        log.exception("%s: /%s failed for %s", caller.platform, name, caller.user_id)
        return Answer(command.failed)


async def press(port: CommandPort, name: str, caller: Caller, value: str) -> Answer:
    """The answer to pressing a button (an action of ACTIONS, on `value`), for whoever pressed it."""
    action = ACTIONS[name]
    try:
        return Answer(await action.act(port, caller, value))
    except Exception:
        log.exception("%s: the %s button failed for %s", caller.platform, name, caller.user_id)
        return Answer(action.failed)
