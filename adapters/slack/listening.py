"""Slack's side of listening channels (bot/channels/port.py): a channel
message's mode, the lines heard in `listen` and `open` channels handed to the
bot before Slack is acknowledged (a failure leaves the event unacknowledged,
so Slack delivers it again; keeping is idempotent by the message's `ts`),
`message_changed` / `message_deleted` applied to what was kept, and who may
change a channel's mode with /channel (workspace admins and owners, and
SLACK_CHANNEL_MANAGERS).

A channel is keyed by the workspace receiving the event (the payload's
`team_id`) and its id; a thread is its channel's. A DM never comes here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from adapters.channels import default_mode
from adapters.slack.api import CALL_ERRORS, error_code
from adapters.slack.config import PLATFORM, SlackConfig
from adapters.slack.directory import Directory
from adapters.slack.format import slack_to_plain, time_of
from bot.channels.port import ChannelPort, ChannelRef, Heard, Mode
from bot.events import Place, PlaceKind

log = logging.getLogger(__name__)

# Messages people write (a thread reply also sent to the channel is one of them).
HEARD_SUBTYPES = frozenset({None, "file_share", "thread_broadcast"})
EDITED, DELETED = "message_changed", "message_deleted"
KINDS: dict[str, PlaceKind] = {"mpim": "private", "group": "private", "channel": "public"}


def in_a_channel(event: Mapping[str, Any]) -> bool:
    """A message in a channel (public, private or a group DM), never a DM."""
    return event.get("channel_type") != "im" and str(event.get("channel") or "")[:1] in ("C", "G")


def workspace_of(body: Mapping[str, Any], event: Mapping[str, Any]) -> str:
    """The workspace receiving the event: a shared channel's memory is its own in each."""
    return str(body.get("team_id") or event.get("team") or "")


def speaker_team(body: Mapping[str, Any], event: Mapping[str, Any]) -> str:
    # As parse.py names people: their own team (in a shared channel it may not be ours).
    return str(event.get("user_team") or event.get("team") or body.get("team_id") or "")


class SlackListening:
    """What the Slack adapter asks and tells the bot about a channel's memory."""

    def __init__(self, bot: ChannelPort, config: SlackConfig, directory: Directory) -> None:
        self.bot = bot
        self.config = config
        self.directory = directory

    def default(self, channel: str) -> Mode:
        return default_mode(self.config.always_on_channels, self.config.listen_channels, channel)

    @staticmethod
    def named(body: Mapping[str, Any], event: Mapping[str, Any]) -> ChannelRef:
        """The channel an event happened in, enough to name it (its key: workspace and id)."""
        return ChannelRef(PLATFORM, workspace_of(body, event), Place("private", str(event.get("channel") or "")))

    async def channel_of(self, body: Mapping[str, Any], event: Mapping[str, Any]) -> ChannelRef:
        """The channel an event happened in, with its kind (what its lines record): from the
        payload, else conversations.info."""
        channel = str(event.get("channel") or "")
        kind = KINDS.get(str(event.get("channel_type") or ""))
        if kind is None:  # app_mention events carry no channel_type
            info = await self.directory.channel(channel)
            kind = info.kind if info is not None and info.kind != "dm" else "private"  # unknown: the safe side
        return ChannelRef(PLATFORM, workspace_of(body, event), Place(kind, channel))

    def channel_of_command(self, command: Mapping[str, Any]) -> ChannelRef | None:
        """Where a slash command was typed, when that is a channel (None in a DM)."""
        channel = str(command.get("channel_id") or "")
        if channel[:1] not in ("C", "G"):
            return None
        return self.named({"team_id": command.get("team_id")}, {"channel": channel})

    async def mode(self, channel: ChannelRef) -> Mode:
        return await self.bot.channel_mode(channel, self.default(channel.place.id))

    async def hear(self, body: Mapping[str, Any], event: Mapping[str, Any]) -> tuple[Mode, str]:
        """A person's message in a channel: its mode, and, in `listen` and `open`, the line
        handed to the bot (raises when it cannot be kept: do not acknowledge then) with
        the notice to post there ("" but the first time)."""
        mode = await self.mode(self.named(body, event))
        if mode == "mention" or event.get("subtype") not in HEARD_SUBTYPES:
            return mode, ""
        channel = await self.channel_of(body, event)
        team, user = speaker_team(body, event), str(event["user"])
        person = await self.directory.person(team, user, event.get("user_profile"))
        heard = Heard(
            channel=channel,
            message_id=str(event["ts"]),
            user_id=f"{team}:{user}",
            speaker_name=person.name,
            text=slack_to_plain(str(event.get("text") or ""), self.directory.known_names(team)).strip(),
            said_at=time_of(event.get("ts")),
        )
        return mode, await self.bot.hear(heard)

    async def changed(self, body: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        """An edit or a deletion in a channel, applied to its kept line (if any was kept)."""
        channel = self.named(body, event)
        if event.get("subtype") == DELETED:
            await self.bot.heard_delete(channel, str(event.get("deleted_ts") or ""))
            return
        message = event.get("message") or {}
        if not message.get("ts") or "text" not in message:
            return
        team = speaker_team(body, message)
        text = slack_to_plain(str(message["text"]), self.directory.known_names(team)).strip()
        edited = (message.get("edited") or {}).get("ts") or event.get("event_ts") or event.get("ts")
        await self.bot.heard_edit(channel, str(message["ts"]), text, time_of(edited))

    async def manages(self, user: str) -> bool:
        """Whether the person may change a channel's mode: named in SLACK_CHANNEL_MANAGERS,
        or a workspace admin or owner (users.info; a failure says no)."""
        if user in self.config.channel_managers:
            return True
        try:
            info = (await self.directory.client.users_info(user=user))["user"]
        except (*CALL_ERRORS, KeyError) as error:
            log.warning("slack: users.info for %s failed (%s); not a manager for now", user, error_code(error))
            return False
        return bool(info.get("is_admin") or info.get("is_owner") or info.get("is_primary_owner"))
