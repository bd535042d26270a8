"""Slack payloads into typed bot events, in two steps.

First, before Slack gets its acknowledgement, `envelope_of_<event>` reads a raw
Events API payload without any I/O: is it for the bot at all (never another
bot's message, an edit or the bot's own), who is it from, and where do answers
go. Its `Origin` is what the inbox keeps with the payload.

Then, in the person's lane, `SlackParser.parse_<kind>` turns a recorded payload
into typed events (`UserMessage`, `UserJoined`, `FileUploaded`), reading the
names, files, place (`place_of`: from the payload's `channel_type`, else
`conversations.info`) and channel context it needs; a replay after a crash runs
the same function on the same recorded payload, so it finds the same place.
Like discord.py's `ConnectionState.parse_<event>`: one small function per
platform event.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adapters.pipeline import Item
from adapters.slack.config import PLATFORM
from adapters.slack.directory import Directory
from adapters.slack.files import DownloadError, FileReader, FileRefused
from adapters.slack.format import slack_to_plain, time_of
from adapters.slack.history import ChannelHistory
from bot.events import FileUploaded, Place, PlaceKind, Reply, UserJoined, UserMessage

log = logging.getLogger(__name__)

# An Events API `channel_type` as a kind of place (app_mention events carry none).
KINDS: dict[str, PlaceKind] = {"im": "dm", "mpim": "private", "group": "private", "channel": "public"}


def _team_of(body: Mapping[str, Any], event: Mapping[str, Any]) -> str:
    # The user's own team: in shared channels that differs from the workspace receiving the event.
    return str(event.get("user_team") or event.get("team") or body.get("team_id") or "")


@dataclass(slots=True)
class Envelope:
    """Who a payload is from, where answers to it go, and its Events API id."""

    team: str
    user: str
    reply_to: dict[str, Any]
    event_id: str
    created_at: datetime
    workspace: str = ""  # the team receiving the event (a channel's memory is its own in each)

    @classmethod
    def of(
        cls, body: Mapping[str, Any], team: str, user: str, reply_to: dict[str, Any], ts: Any, event_id: str = ""
    ) -> Envelope:
        event_id = event_id or str(body.get("event_id") or uuid.uuid4().hex)
        return cls(team, user, reply_to, event_id, time_of(ts), str(body.get("team_id") or team))

    def to_json(self) -> dict[str, Any]:
        return {
            "team": self.team,
            "user": self.user,
            "reply_to": self.reply_to,
            "event_id": self.event_id,
            "created_at": self.created_at.isoformat(),
            "workspace": self.workspace,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Envelope:
        return cls(
            str(data["team"]),
            str(data["user"]),
            dict(data["reply_to"]),
            str(data["event_id"]),
            datetime.fromisoformat(str(data["created_at"])),
            str(data.get("workspace") or data["team"]),  # recorded before workspaces: the user's team
        )

    @property
    def user_id(self) -> str:
        return f"{self.team}:{self.user}"

    @property
    def awaits_answer(self) -> bool:
        """Someone wrote and waits for an answer (not so after a join)."""
        return "channel" in self.reply_to

    def fields(self, **extra: Any) -> dict[str, Any]:
        """The arguments every event built from this payload shares."""
        return {
            "platform": PLATFORM,
            "user_id": self.user_id,
            "reply_to": self.reply_to,
            "dm_reply_to": {"dm_user": self.user},  # the DM, opened on demand (send.py)
            "event_id": self.event_id,
            "created_at": self.created_at,
            "in_inbox": True,
            "inbox_id": self.event_id,  # a file's event has its own id, the inbox entry is the payload's
            **extra,
        }

    def notice(self, text: str, event_id: str | None = None) -> Reply:
        """A message the adapter sends itself (a refused file, an apology)."""
        return Reply(
            text=text,
            platform=PLATFORM,
            user_id=self.user_id,
            reply_to=self.reply_to,
            event_id=event_id or self.event_id,
        )


# --------------------------------------------------------------------------- step one: for the bot?


def is_from_a_bot(event: Mapping[str, Any], own_user_id: str | None) -> bool:
    return bool(event.get("bot_id")) or not event.get("user") or event.get("user") == own_user_id


def envelope_of_message(
    body: Mapping[str, Any], event: Mapping[str, Any], own_user_id: str | None, open_here: bool = False
) -> Envelope | None:
    """A direct message (with or without files), or any message in an `open`
    channel (or a thread there: `open_here`); None for anything else."""
    if event.get("subtype") not in (None, "file_share") or is_from_a_bot(event, own_user_id):
        return None  # edits, deletions, bot messages, joins...: nothing a person said to the bot
    if event.get("channel_type") != "im":
        return envelope_in_channel(body, event, open_here)
    reply_to = {"channel": event["channel"]}
    if event.get("thread_ts"):
        reply_to["thread_ts"] = event["thread_ts"]
    return Envelope.of(body, _team_of(body, event), str(event["user"]), reply_to, event.get("ts"))


def message_kind(event: Mapping[str, Any]) -> str:
    return "file_share" if event.get("subtype") == "file_share" else "message"


def envelope_of_app_mention(
    body: Mapping[str, Any], event: Mapping[str, Any], own_user_id: str | None, open_here: bool = False
) -> Envelope | None:
    if is_from_a_bot(event, own_user_id):
        return None
    return envelope_in_channel(body, event, open_here, mentioned=True)


def envelope_in_channel(
    body: Mapping[str, Any], event: Mapping[str, Any], open_here: bool, *, mentioned: bool = False
) -> Envelope | None:
    """A mention, or a message in an `open` channel: answered in its thread (or
    the thread it was posted in), addressed to its author."""
    channel = str(event.get("channel") or "")
    if not (mentioned or open_here):
        return None
    reply_to = {"channel": channel, "thread_ts": event.get("thread_ts") or event["ts"], "mention": event["user"]}
    # In an open channel a mention arrives twice (a message and an app_mention
    # event, each with its own event id): keyed by the message, the second is a repeat.
    key = f"{channel}:{event['ts']}" if open_here else ""
    return Envelope.of(body, _team_of(body, event), str(event["user"]), reply_to, event.get("ts"), key)


def envelope_of_team_join(body: Mapping[str, Any], event: Mapping[str, Any]) -> Envelope | None:
    person = event.get("user") or {}
    if not isinstance(person, dict) or not person.get("id") or person.get("is_bot"):
        return None
    team = str(person.get("team_id") or body.get("team_id") or "")
    return Envelope.of(body, team, str(person["id"]), {"dm_user": person["id"]}, body.get("event_time"))


def envelope_of_member_joined_channel(
    body: Mapping[str, Any], event: Mapping[str, Any], own_user_id: str | None
) -> Envelope | None:
    if is_from_a_bot(event, own_user_id):
        return None  # the bot itself was added to a channel
    return Envelope.of(
        body, _team_of(body, event), str(event["user"]), {"dm_user": event["user"]}, event.get("event_ts")
    )


# --------------------------------------------------------------------------- step two: typed events


class SlackParser:
    """Recorded payloads into typed events, with the names and files they need."""

    def __init__(self, directory: Directory, files: FileReader, history: ChannelHistory) -> None:
        self.directory = directory
        self.files = files
        self.history = history
        # Like discord.py's ConnectionState: the table is the `parse_<kind>` methods.
        self._parsers: dict[str, Callable[[Envelope, Mapping[str, Any]], Awaitable[list[Item]]]] = {
            name.removeprefix("parse_"): getattr(self, name) for name in dir(self) if name.startswith("parse_")
        }

    async def parse(self, kind: str, envelope: Envelope, event: Mapping[str, Any]) -> list[Item]:
        """The typed events of one recorded payload, by kind (also how a replay rebuilds it)."""
        return await self._parsers[kind](envelope, event)

    async def place_of(self, event: Mapping[str, Any]) -> Place:
        """Where the event happened: its kind from the payload's `channel_type`, or
        (mentions, replays of them) from `conversations.info`; its name from there."""
        channel, thread = str(event.get("channel") or ""), str(event.get("thread_ts") or "")
        kind = KINDS.get(str(event.get("channel_type") or ""))
        info = None if kind == "dm" else await self.directory.channel(channel)
        # Slack would not say: private, the safe side both ways (what is said here
        # stays out of other channels, and only this channel's and public items are read).
        kind = kind or (info.kind if info is not None else "private")
        if kind == "dm":
            return Place(thread=thread)
        return Place(kind, channel, info.name if info is not None else channel, thread)

    async def parse_message(self, envelope: Envelope, event: Mapping[str, Any]) -> list[Item]:
        text = str(event.get("text") or "")
        if self.directory.bot_user_id:
            text = re.sub(rf"<@{re.escape(self.directory.bot_user_id)}(?:\|[^>]*)?>", "", text)
        person = await self.directory.person(envelope.team, envelope.user, event.get("user_profile"))
        place = await self.place_of(event)
        context = [] if place.is_dm else await self.history.before(envelope.team, event, place)
        plain = slack_to_plain(text, self.directory.known_names(envelope.team)).strip()
        message = envelope.fields(
            text=plain or "(an empty message)",
            display_name=person.name,
            channel="" if place.is_dm else place.name,
            workspace="" if place.is_dm else envelope.workspace,
            place=place,
            channel_context=context,
        )
        return [UserMessage(**message)]

    parse_app_mention = parse_message

    async def parse_file_share(self, envelope: Envelope, event: Mapping[str, Any]) -> list[Item]:
        person = await self.directory.person(envelope.team, envelope.user, event.get("user_profile"))
        place = await self.place_of(event)
        items: list[Item] = []
        for number, shared in enumerate(event.get("files") or []):
            file_event_id = f"{envelope.event_id}:{number}"
            try:
                got = await self.files.read(shared)
            except FileRefused as refusal:
                items.append(envelope.notice(str(refusal), file_event_id))
            except DownloadError as error:
                log.warning("slack: could not download file %s: %s", shared.get("id"), error)
                name = shared.get("name") or "that file"
                items.append(
                    envelope.notice(f"I couldn't download {name} from Slack, so I didn't save it.", file_event_id)
                )
            else:
                uploaded = envelope.fields(
                    event_id=file_event_id,
                    filename=got.name,
                    data=got.data,
                    content_type=got.content_type,
                    display_name=person.name,
                    place=place,
                )
                items.append(FileUploaded(**uploaded))
        if str(event.get("text") or "").strip():
            items += await self.parse_message(envelope, event)
        return items

    async def parse_team_join(self, envelope: Envelope, event: Mapping[str, Any]) -> list[Item]:
        person = await self.directory.person(envelope.team, envelope.user, (event.get("user") or {}).get("profile"))
        workspace = self.directory.team_names.get(envelope.team)
        place = f"the {workspace} Slack workspace" if workspace else "the Slack workspace"
        return [UserJoined(**envelope.fields(display_name=person.name, joined=place))]

    async def parse_member_joined_channel(self, envelope: Envelope, event: Mapping[str, Any]) -> list[Item]:
        person = await self.directory.person(envelope.team, envelope.user)
        if person.is_bot:
            return []
        channel = await self.directory.channel_name(str(event["channel"]))
        return [UserJoined(**envelope.fields(display_name=person.name, joined=channel))]
