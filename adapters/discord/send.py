"""Replies out to Discord: split under the 2,000-character limit, sent where
`reply_to` says (a channel, else the person's DMs, else a fallback channel when
their DMs are closed), and what each attempt came to for the bot's outbox.
These functions only send; whether to try again is the outbox's decision.

Delivery outcomes, per reply with an outbox entry (`report_delivery`): sent;
RETRY for 429, 5xx and network errors; UNDELIVERABLE when the person cannot be
reached (50007: DMs closed, the bot blocked, no shared server; with no fallback
channel), the channel or user is unknown (404), or Discord refuses the message
(any other 4xx). While a reply to a person waits for a retry, their later
replies are not tried but held behind it (reported RETRY) (bot/durable/lanes.py, the same
order as on Slack), so the retrier sends them after the failed one, in order;
other people's replies still go.

Resending without duplicates. Every part of a reply with an outbox entry is
sent with a nonce derived from its outbox id and part number (a 25-character
digest: Discord's limit), and discord.py (2.7, `http.handle_message_parameters`)
sends `enforce_nonce: true` with every nonce: for a few minutes Discord answers
a repeated part with the message it already created instead of a new one. That
covers discord.py's own retries and the outbox retrier's quick ones. A crash
can outlast the window, and messages read back from history need not carry
their nonce, so a reply marked `resend` is first looked for among the channel's
last 50 messages: the bot's messages newer than the answered message that match
its parts in order (by nonce where one is given, else by content) are not sent
again. Limit: two replies to one event with the very same text may be taken for
one another when matched by content; beyond 50 newer messages a part is sent
again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import discord

from adapters.discord.config import MESSAGE_LIMIT
from adapters.splitting import split_message
from bot.events import Delivery, Reply

log = logging.getLogger(__name__)

# What a REST call may raise besides a bug: Discord's answer, its rate limiter, the network.
CALL_ERRORS = (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError)
CANNOT_MESSAGE_USER = 50007  # DMs closed, the bot blocked, or no server shared any more
HISTORY_LIMIT = 50  # recent messages searched for a reply's parts before it is sent again


async def send_reply(
    client: discord.Client, reply: Reply, channel: discord.abc.Messageable | None = None
) -> tuple[Delivery, str]:
    """Send one reply to `channel`, or where its `reply_to` says; what came of it."""
    if not reply.text.strip():
        return Delivery.SENT, ""  # nothing to show: done
    where = reply.reply_to
    user_id = int(where["user_id"])
    try:
        target = channel or await _target(client, where)
        await _post(client, target, reply, mention=user_id if where.get("guild") else None)
    except discord.Forbidden as error:
        fallback = _fallback(client, where)
        if fallback is None:
            return _failed(reply, error)
        log.info(
            "could not reach Discord user %s directly (%s); using channel %s",
            reply.user_id,
            describe_error(error),
            getattr(fallback, "id", "?"),
        )
        try:
            await _post(client, fallback, reply, mention=user_id)
        except CALL_ERRORS as second:
            return _failed(reply, second)
    except CALL_ERRORS as error:
        return _failed(reply, error)
    return Delivery.SENT, ""


async def _post(client: discord.Client, channel: discord.abc.Messageable, reply: Reply, *, mention: int | None) -> None:
    """One reply as messages under the limit; in shared channels the first pings its user.
    A durable reply's parts carry nonces, and a resent one skips the parts already there."""
    prefix = f"<@{mention}> " if mention is not None else ""
    allowed = (
        discord.AllowedMentions(everyone=False, roles=False, users=[discord.Object(id=mention)])
        if (mention is not None)
        else discord.AllowedMentions.none()
    )
    chunks = split_message(reply.text, MESSAGE_LIMIT - len(prefix))
    chunks[0] = prefix + chunks[0]
    posted = await _parts_posted(client, channel, reply, chunks) if reply.resend and reply.outbox_id else 0
    for part in range(posted, len(chunks)):
        extra: dict[str, Any] = {"nonce": nonce_of(reply.outbox_id, part)} if reply.outbox_id else {}
        await channel.send(chunks[part], allowed_mentions=allowed, **extra)


async def _parts_posted(
    client: discord.Client, channel: discord.abc.Messageable, reply: Reply, chunks: Sequence[str]
) -> int:
    """How many of the reply's first parts are already in the channel (its recent history)."""
    me = client.user
    if me is None:
        return 0
    try:
        recent = [message async for message in channel.history(limit=HISTORY_LIMIT)]
    except CALL_ERRORS as error:
        # Without history access, sending twice beats never sending (and the nonce may still catch it).
        log.warning(
            "cannot check channel %s for reply %s before sending it again: %s",
            getattr(channel, "id", "?"),
            reply.outbox_id,
            describe_error(error),
        )
        return 0
    since = snowflake_of(reply.event_id)  # the answered message: its replies are newer
    posted = 0
    for message in sorted(recent, key=lambda message: message.id):
        if posted == len(chunks):
            break
        if message.author.id != me.id or (since is not None and message.id <= since):
            continue
        if message.nonce is not None:  # only in messages this process saw created
            same = str(message.nonce) == nonce_of(reply.outbox_id, posted)
        else:
            same = message.content.strip() == chunks[posted].strip()
        if same:
            posted += 1
    if posted:
        log.info(
            "reply %s to Discord user %s: %d of %d parts were already sent",
            reply.outbox_id,
            reply.user_id,
            posted,
            len(chunks),
        )
    return posted


async def _target(client: discord.Client, where: Mapping[str, Any]) -> discord.abc.Messageable:
    channel_id = where.get("channel_id")
    if channel_id:
        channel = client.get_channel(int(channel_id))
        if isinstance(channel, discord.abc.Messageable):
            return channel
        return client.get_partial_messageable(int(channel_id))
    user_id = int(where["user_id"])
    return client.get_user(user_id) or await client.fetch_user(user_id)


def _fallback(client: discord.Client, where: Mapping[str, Any]) -> discord.abc.Messageable | None:
    channel_id = where.get("fallback_channel_id")
    if not channel_id:
        return None
    channel = client.get_channel(int(channel_id))
    return channel if isinstance(channel, discord.abc.Messageable) else None


def _failed(reply: Reply, error: BaseException) -> tuple[Delivery, str]:
    outcome, detail = outcome_of(error), describe_error(error)
    # Who and why, never what: the reply's text stays out of the logs.
    log.warning(
        "could not send a reply to Discord user %s (event %s, channel %s): %s; %s",
        reply.user_id,
        reply.event_id,
        reply.reply_to.get("channel_id") or "DM",
        detail,
        "will retry" if outcome is Delivery.RETRY else "dropped",
    )
    return outcome, detail


@asynccontextmanager
async def typing(channel: discord.abc.Messageable | None) -> AsyncIterator[None]:
    """Show "typing…" in `channel` while the body runs (discord.py renews it every few seconds)."""
    async with AsyncExitStack() as stack:
        if channel is not None:
            try:  # a nicety: lacking the permission to type must not stop the answer
                await stack.enter_async_context(channel.typing())
            except discord.HTTPException as error:
                log.info("no typing indicator in channel %s: %s", getattr(channel, "id", "?"), error)
        yield


def nonce_of(outbox_id: str, part: int) -> str:
    """The nonce of one part of a reply: the same on every attempt, unique per part, and within
    Discord's 25 characters."""
    return hashlib.sha256(f"{outbox_id}#{part}".encode()).hexdigest()[:25]


def outcome_of(error: BaseException) -> Delivery:
    """What a failed send means for the reply. Discord's own 5xx and 429 answers are retried
    by discord.py before they get here; what is left is worth another try later."""
    if isinstance(error, discord.HTTPException):
        return Delivery.RETRY if error.status == 429 or error.status >= 500 else Delivery.UNDELIVERABLE
    if isinstance(error, discord.RateLimited | aiohttp.ClientError | OSError):
        return Delivery.RETRY
    return Delivery.UNDELIVERABLE


def describe_error(error: BaseException) -> str:
    """Why a call failed, for a log line or the outbox: never the text that was sent."""
    if isinstance(error, discord.HTTPException):
        if error.code == CANNOT_MESSAGE_USER:
            return (
                f"{error.status} (code {error.code}): they take no messages from the bot "
                "(DMs closed, the bot blocked, or no server shared)"
            )
        code = f" (code {error.code})" if error.code else ""
        return f"{error.status}{code}: {error.text or type(error).__name__}"
    return f"{type(error).__name__}: {error}"


def snowflake_of(event_id: str) -> int | None:
    """The message id an event id starts with ("<message>" or "<message>:<attachment>"), if any."""
    head = event_id.split(":", 1)[0]
    return int(head) if head.isdigit() and len(head) <= 20 else None
