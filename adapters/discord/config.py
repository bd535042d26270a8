"""The Discord adapter's settings, read from the environment, and the
platform's constants that every part of the adapter shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from adapters.channels import context_messages, id_list
from bot.errors import ConfigError

PLATFORM = "discord"
MESSAGE_LIMIT = 2_000
DEFAULT_MAX_UPLOAD_BYTES = 5 * 1024 * 1024


@dataclass(slots=True)
class DiscordConfig:
    token: str = field(repr=False)  # never in a log line or a traceback
    always_on_channels: frozenset[int] = frozenset()
    # Channels whose messages the bot keeps for the channel, answering only mentions
    # (DISCORD_LISTEN_CHANNELS); a manager's /channel overrides both lists.
    listen_channels: frozenset[int] = frozenset()
    sharded: bool = False  # AutoShardedClient instead of a plain Client
    shard_count: int | None = None  # None with sharded: Discord's recommended count
    shard_ids: tuple[int, ...] | None = None  # the shards this process runs (several processes)
    command_guild_id: int | None = None  # sync slash commands to one server only (instant)
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    # The base of Discord's REST API (DISCORD_API_URL): a REST proxy in front of the
    # rate limits, or a local stand-in. It does not move the gateway: discord.py's
    # plain client always dials its default gateway.
    api_url: str | None = None
    # The gateway's address (DISCORD_GATEWAY_URL, ws:// or wss://): a local stand-in
    # or a gateway proxy; None: Discord's own (wss://gateway.discord.gg).
    gateway_url: str | None = None
    # How many recent messages of a channel the bot reads when answering there
    # (MEMGPT_CHANNEL_CONTEXT_MESSAGES; 0: none).
    channel_context_messages: int = 20

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
            listen_channels=frozenset(_ids(env.get("DISCORD_LISTEN_CHANNELS", ""), "DISCORD_LISTEN_CHANNELS")),
            sharded=bool(shards),
            shard_count=shard_count,
            shard_ids=shard_ids,
            command_guild_id=_positive(guild, "DISCORD_COMMAND_GUILD_ID") if guild else None,
            max_upload_bytes=_positive(upload, "DISCORD_MAX_UPLOAD_BYTES") if upload else DEFAULT_MAX_UPLOAD_BYTES,
            api_url=_url(env.get("DISCORD_API_URL", ""), "DISCORD_API_URL", ("http", "https"), API_EXAMPLE),
            gateway_url=_url(env.get("DISCORD_GATEWAY_URL", ""), "DISCORD_GATEWAY_URL", ("ws", "wss"), GATEWAY_EXAMPLE),
            channel_context_messages=context_messages(env),
        )


API_EXAMPLE = "https://discord.com/api/v10"
GATEWAY_EXAMPLE = "wss://gateway.discord.gg"


def _url(value: str, name: str, schemes: tuple[str, ...], example: str) -> str | None:
    value = value.strip().rstrip("/")
    if value and not value.startswith(tuple(f"{scheme}://" for scheme in schemes)):
        allowed = " or ".join(f"{scheme}://" for scheme in schemes)
        raise ConfigError(f"{name}={value!r}: must be an {allowed} URL, e.g. {example}")
    return value or None


def _positive(value: str, name: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise ConfigError(f"{name} must be a positive whole number, not {value!r}")
    return int(value)


def _ids(value: str, name: str, *, allow_zero: bool = False) -> list[int]:
    def valid(part: str) -> bool:
        return part.isdigit() and (int(part) != 0 or allow_zero)

    return [int(part) for part in id_list(value, name, valid=valid, what="numeric ids (Developer Mode → Copy ID)")]
