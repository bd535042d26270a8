"""The Discord adapter's small parts: configuration from the environment, the
client's intents, reply addresses, and what a failed send means (bot/durable/journal.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import discord

from bot.config import ConfigError
from bot.events import Delivery

DEFAULT_MAX_UPLOAD_BYTES = 5 * 1024 * 1024
# What a REST call may raise besides a bug: Discord's answer, its rate limiter, the network.
CALL_ERRORS = (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError)
CANNOT_MESSAGE_USER = 50007  # DMs closed, the bot blocked, or no server shared any more


@dataclass(slots=True)
class DiscordConfig:
    token: str = field(repr=False)  # never in a log line or a traceback
    always_on_channels: frozenset[int] = frozenset()
    sharded: bool = False  # AutoShardedClient instead of a plain Client
    shard_count: int | None = None  # None with sharded: Discord's recommended count
    shard_ids: tuple[int, ...] | None = None  # the shards this process runs (several processes)
    command_guild_id: int | None = None  # sync slash commands to one server only (instant)
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DiscordConfig | None:
        """The Discord settings, or None when DISCORD_TOKEN is unset (Discord is off)."""
        token = env.get("DISCORD_TOKEN", "").strip()
        if not token:
            return None
        shards = env.get("DISCORD_SHARD_COUNT", "").strip().lower()
        shard_count = None if shards in ("", "auto") else _positive(shards, "DISCORD_SHARD_COUNT")
        shard_ids = tuple(_ids(env.get("DISCORD_SHARD_IDS", ""), "DISCORD_SHARD_IDS", allow_zero=True)) or None
        if shard_ids is not None:
            if shard_count is None:
                raise ConfigError("DISCORD_SHARD_IDS needs a numeric DISCORD_SHARD_COUNT (the total across processes)")
            if max(shard_ids) >= shard_count:
                raise ConfigError(f"DISCORD_SHARD_IDS must be below DISCORD_SHARD_COUNT ({shard_count})")
        guild = env.get("DISCORD_COMMAND_GUILD_ID", "").strip()
        upload = env.get("DISCORD_MAX_UPLOAD_BYTES", "").strip()
        return cls(
            token=token,
            always_on_channels=frozenset(_ids(env.get("DISCORD_ALWAYS_ON_CHANNELS", ""), "DISCORD_ALWAYS_ON_CHANNELS")),
            sharded=bool(shards),
            shard_count=shard_count,
            shard_ids=shard_ids,
            command_guild_id=_positive(guild, "DISCORD_COMMAND_GUILD_ID") if guild else None,
            max_upload_bytes=_positive(upload, "DISCORD_MAX_UPLOAD_BYTES") if upload else DEFAULT_MAX_UPLOAD_BYTES,
        )


def _positive(value: str, name: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise ConfigError(f"{name} must be a positive whole number, not {value!r}")
    return int(value)


def _ids(value: str, name: str, *, allow_zero: bool = False) -> list[int]:
    parts = [part.strip() for part in value.split(",") if part.strip()]
    bad = [part for part in parts if not part.isdigit() or (int(part) == 0 and not allow_zero)]
    if bad:
        raise ConfigError(f"{name} takes comma-separated numeric ids (Developer Mode → Copy ID), not {bad[0]!r}")
    return [int(part) for part in parts]


def dm_address(user_id: int, *, fallback_channel_id: int | None = None) -> dict[str, Any]:
    """A `reply_to` that sends to the user's DMs (for replies not answering a message, such as
    check-ins); `fallback_channel_id`, if set, is used, with a mention, when their DMs are closed."""
    return {"channel_id": None, "guild": False, "user_id": user_id, "fallback_channel_id": fallback_channel_id}


def intents() -> discord.Intents:
    """Only what the adapter uses. message_content and members are privileged: they must
    also be switched on in the Developer Portal (Bot → Privileged Gateway Intents)."""
    wanted = discord.Intents.none()
    wanted.guilds = True  # channel and server names, the bot's own role
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True
    wanted.members = True  # on_member_join
    return wanted


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
