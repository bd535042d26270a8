"""The chat platforms the adapter conformance suite (tests/conformance/test_adapters.py)
runs over: each is the stand-in for a platform's servers (tests/fake_slack.py,
tests/fake_discord.py) and what a person does there, in one small driver, so that
every test reads the same on every platform. The bot itself is `memgpt-bot run` in
its own process (`BotProcess`), talking to the stand-in through the platform's real
client library (slack-bolt / slack-sdk in Socket Mode; discord.py's gateway and HTTP).

People: "alice" (a member of the private channel) and "bob"; "carol", of another
workspace (Slack) or also in another server (Discord). Places: "dm:<person>",
"public", "private", "other" (a second public channel) and "far" (a public channel
of the other workspace or server; on Slack the same channel id as "public", as a
channel shared between two workspaces has).
"""

from __future__ import annotations

import itertools
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tests.fake_discord import FakeDiscord
from tests.fake_slack import FakeSlack
from tests.forks import RunningCLI
from tests.secrets_catalog import DISCORD_TOKEN
from tests.test_cli import base_env

READY_LINE = "check-ins: scheduler started"  # `memgpt-bot run` says it once every adapter is ready


class ChatPlatform(Protocol):
    name: str
    secrets: tuple[str, ...]  # what must never reach a log

    def env(self) -> dict[str, str]: ...
    def dm(self, person: str, text: str) -> Any: ...
    def mention(self, place: str, person: str, text: str) -> Any: ...
    def say(self, place: str, person: str, text: str) -> Any:
        """A message that does not mention the bot."""
        ...

    def redeliver(self, sent: Any) -> None: ...
    def message_id(self, sent: Any) -> str:
        """The platform's id of a message `say` or `mention` sent."""
        ...

    def edit(self, sent: Any, text: str) -> None:
        """Its author edits a message `say` sent."""
        ...

    def delete(self, sent: Any) -> None: ...
    def listen(self, *places: str) -> dict[str, str]:
        """The settings that make these channels listen."""
        ...

    def command(self, person: str, name: str, **options: str) -> None:
        """`person` runs the slash command `/name` in their DMs (options as `name: value`)."""
        ...

    def press(self, person: str, label: str) -> None:
        """`person` presses the button `label` under the newest answer that has one."""
        ...

    def private_answers(self, person: str) -> list[str]:
        """What the bot answered `person`'s commands, seen by them alone."""
        ...

    def reconnect(self) -> None:
        """The platform asks the bot's connection to reconnect."""
        ...

    def connections(self) -> int:
        """How many connections the bot has opened so far."""
        ...

    def replies(self, place: str) -> list[str]: ...
    def wait_until(self, condition: Callable[[], bool], within: float) -> None: ...
    def down(self) -> None:
        """The platform's API and event connection fail (5xx) until `up()`."""
        ...

    def up(self) -> None: ...


# -- Slack -------------------------------------------------------------------------------
class SlackPlatform:
    name = "slack"

    def __init__(self, slack: FakeSlack) -> None:
        self.slack = slack
        self.secrets = (slack.bot_token, slack.app_token)
        self.ids = {"alice": "U1", "bob": "U2", "carol": "U3"}
        self.teams = {"alice": slack.team_id, "bob": slack.team_id, "carol": "T2"}
        for person, user_id in self.ids.items():
            slack.add_user(user_id, person.title(), team_id=self.teams[person])
        slack.add_channel("C1", "general")
        slack.add_channel("G1", "team", private=True)
        slack.add_channel("C2", "random")
        self.channels = {"public": "C1", "private": "G1", "other": "C2", "far": "C1"}

    def env(self) -> dict[str, str]:
        return {
            "SLACK_BOT_TOKEN": self.slack.bot_token,
            "SLACK_APP_TOKEN": self.slack.app_token,
            "SLACK_API_URL": self.slack.api_url,
        }

    def _channel(self, place: str) -> str:
        return f"D{self.ids[place[3:]]}" if place.startswith("dm:") else self.channels[place]

    def _team(self, place: str) -> str:
        return "T2" if place == "far" else self.slack.team_id

    def _kind(self, place: str) -> str:
        return "group" if place == "private" else "channel"

    def _send(self, event: dict[str, Any], team: str = "") -> dict[str, Any]:
        team = team or self.slack.team_id
        body = {
            "token": "legacy-verification-token",
            "team_id": team,
            "api_app_id": "A1",
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{uuid.uuid4().hex[:12].upper()}",
            "event_time": int(time.time()),
            "authorizations": [{"team_id": team, "user_id": self.slack.bot_user_id, "is_bot": True}],
        }
        self.wait_until(lambda: self.slack.socket_connected, 60)
        self.slack.send_socket_event(body)
        return body

    def dm(self, person: str, text: str) -> Any:
        user = self.ids[person]
        message = self.slack.add_message(f"D{user}", user, text)
        return self._send(message | {"channel": f"D{user}", "channel_type": "im", "team": self.slack.team_id})

    def mention(self, place: str, person: str, text: str) -> Any:
        # Slack sends both: the app_mention, and the message itself (message.channels).
        channel, user, team = self._channel(place), self.ids[person], self._team(place)
        message = self.slack.add_message(channel, user, f"<@{self.slack.bot_user_id}> {text}")
        where = {"channel": channel, "team": team}
        sent = self._send(message | where | {"type": "app_mention"}, team)
        self._send(message | where | {"channel_type": self._kind(place)}, team)
        return sent

    def say(self, place: str, person: str, text: str) -> Any:
        channel, user, team = self._channel(place), self.ids[person], self._team(place)
        message = self.slack.add_message(channel, user, text)
        return self._send(message | {"channel": channel, "channel_type": self._kind(place), "team": team}, team)

    def message_id(self, sent: Any) -> str:
        return str(sent["event"]["ts"])

    def edit(self, sent: Any, text: str) -> None:
        event, stamp = sent["event"], f"{time.time():.6f}"
        edited = {k: v for k, v in event.items() if k in ("type", "user", "ts", "team")}
        edited |= {"text": text, "edited": {"user": event["user"], "ts": stamp}}
        changed = {"type": "message", "subtype": "message_changed", "hidden": True, "message": edited}
        changed |= {"previous_message": event, "channel": event["channel"], "channel_type": event["channel_type"]}
        self._send(changed | {"ts": stamp, "event_ts": stamp}, sent["team_id"])

    def delete(self, sent: Any) -> None:
        event, stamp = sent["event"], f"{time.time():.6f}"
        deleted = {"type": "message", "subtype": "message_deleted", "hidden": True, "deleted_ts": event["ts"]}
        deleted |= {"previous_message": event, "channel": event["channel"], "channel_type": event["channel_type"]}
        self._send(deleted | {"ts": stamp, "event_ts": stamp}, sent["team_id"])

    def listen(self, *places: str) -> dict[str, str]:
        return {"SLACK_LISTEN_CHANNELS": ",".join(self._channel(place) for place in places)}

    def redeliver(self, sent: Any) -> None:
        # Slack retries an event it thinks was not acknowledged: the same event_id.
        self.wait_until(lambda: self.slack.socket_connected, 60)
        self.slack.send_socket_event(sent, retry_attempt=1, retry_reason="timeout")

    def command(self, person: str, name: str, **options: str) -> None:
        user = self.ids[person]
        payload = {
            "token": "legacy-verification-token",
            "team_id": self.teams[person],
            "channel_id": f"D{user}",
            "user_id": user,
            "command": f"/{name}",
            "text": " ".join(f"{option}: {value}" for option, value in options.items()),
            "api_app_id": "A1",
            "response_url": self.slack.response_url(person),
            "trigger_id": uuid.uuid4().hex,
        }
        self.wait_until(lambda: self.slack.socket_connected, 60)
        self.slack.send_socket_event(payload, envelope_type="slash_commands")

    def press(self, person: str, label: str) -> None:
        user, team = self.ids[person], self.teams[person]
        buttons = [
            element
            for call in self.slack.calls_to("response_url")
            if call.args.get("tag") == person
            for block in call.args.get("blocks") or []
            if block.get("type") == "actions"
            for element in block["elements"]
            if element["text"]["text"] == label
        ]
        payload = {
            "type": "block_actions",
            "team": {"id": team, "domain": "test"},
            "user": {"id": user, "username": person, "team_id": team},
            "api_app_id": "A1",
            "token": "legacy-verification-token",
            "trigger_id": uuid.uuid4().hex,
            "response_url": self.slack.response_url(person),
            "container": {"type": "message", "channel_id": f"D{user}", "is_ephemeral": True},
            "channel": {"id": f"D{user}", "name": "directmessage"},
            "actions": [
                {
                    "type": "button",
                    "action_id": buttons[-1]["action_id"],
                    "block_id": "memgpt",
                    "value": buttons[-1].get("value", ""),
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }
        self.wait_until(lambda: self.slack.socket_connected, 60)
        self.slack.send_socket_event(payload, envelope_type="interactive")

    def private_answers(self, person: str) -> list[str]:
        calls = self.slack.calls_to("response_url")
        return [str(call.args.get("text", "")) for call in calls if call.args.get("tag") == person]

    def reconnect(self) -> None:
        self.slack.ask_to_reconnect()

    def connections(self) -> int:
        return len(self.slack.calls_to("socket_mode.connect"))

    def replies(self, place: str) -> list[str]:
        channel = self._channel(place)
        return [m["text"] for m in self.slack.messages_in(channel) if m.get("user") == self.slack.bot_user_id]

    def wait_until(self, condition: Callable[[], bool], within: float) -> None:
        deadline = time.monotonic() + within
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"slack: not within {within:.0f} s")
            time.sleep(0.05)

    def down(self) -> None:
        for method in ("auth.test", "apps.connections.open"):
            self.slack.fail(method, "internal_error", status=503, times=1_000)

    def up(self) -> None:
        self.slack.reset()


# -- Discord -------------------------------------------------------------------------------
class DiscordPlatform:
    name = "discord"

    def __init__(self, discord: FakeDiscord) -> None:
        self.discord = discord
        self.secrets = (discord.token,)
        self.people = {
            "alice": discord.add_user("Alice", in_private_channel=True),
            "bob": discord.add_user("Bob"),
            "carol": discord.add_user("Carol"),
        }
        self.channels = {
            "public": discord.public_channel,
            "private": discord.private_channel,
            "other": discord.add_channel("random"),
            "far": discord.add_channel("general", guild_id=discord.add_guild()),
        }

    def env(self) -> dict[str, str]:
        return {
            "DISCORD_TOKEN": self.discord.token,
            "DISCORD_API_URL": self.discord.api_url,
            "DISCORD_GATEWAY_URL": self.discord.gateway_url,
        }

    def _channel_id(self, place: str) -> str:
        if place.startswith("dm:"):
            return str(self.discord.dm_channel_of(self.people[place[3:]]["id"])["id"])
        return str(self.channels[place]["id"])

    def _connected(self) -> None:
        self.discord.wait_until(lambda: self.discord.connected > 0, 60)

    def dm(self, person: str, text: str) -> Any:
        self._connected()
        return self.discord.dm(self.people[person], text)

    def mention(self, place: str, person: str, text: str) -> Any:
        self._connected()
        return self.discord.mention(self.channels[place], self.people[person], text)

    def say(self, place: str, person: str, text: str) -> Any:
        self._connected()
        return self.discord.post(self.channels[place]["id"], self.people[person], text)

    def redeliver(self, sent: Any) -> None:
        self._connected()
        self.discord.redeliver(sent)

    def message_id(self, sent: Any) -> str:
        return str(sent["id"])

    def edit(self, sent: Any, text: str) -> None:
        self._connected()
        self.discord.edit(sent, text)

    def delete(self, sent: Any) -> None:
        self._connected()
        self.discord.delete(sent)

    def listen(self, *places: str) -> dict[str, str]:
        return {"DISCORD_LISTEN_CHANNELS": ",".join(str(self.channels[place]["id"]) for place in places)}

    def command(self, person: str, name: str, **options: str) -> None:
        self._connected()
        self.discord.slash_command(self.people[person], name, **options)

    def press(self, person: str, label: str) -> None:
        self._connected()
        user = self.people[person]
        [*_, message] = [
            followup
            for followup in self.discord.followups()
            if any(b["label"] == label for row in followup["components"] for b in row["components"])
        ]
        self.discord.press(user, message, label)

    def private_answers(self, person: str) -> list[str]:
        # The bot defers (thinking, ephemeral), then sends the answer as a follow-up; a pressed
        # question's answer replaces its text (an edit of the interaction's first answer).
        answers = []
        for callback in self.discord.interaction_callbacks:
            data = callback.get("data") or {}
            if callback.get("type") == "followup" and int(data.get("flags") or 0) & 64:
                answers.append(str(data.get("content", "")))
            elif callback.get("type") == "edit" and data.get("content"):
                answers.append(str(data["content"]))
        return answers

    def reconnect(self) -> None:
        self.discord.ask_to_reconnect()

    def connections(self) -> int:
        return self.discord.identifies + self.discord.resumes

    def replies(self, place: str) -> list[str]:
        return [str(m["content"]) for m in self.discord.bot_messages(self._channel_id(place))]

    def wait_until(self, condition: Callable[[], bool], within: float) -> None:
        self.discord.wait_until(condition, within)

    def down(self) -> None:
        self.discord.down(api=True, gateway=True)

    def up(self) -> None:
        self.discord.up()


PLATFORMS = ("slack", "discord")


def open_platform(name: str) -> Iterator[ChatPlatform]:
    """A started stand-in and its driver; stopped after."""
    if name == "slack":
        with FakeSlack() as slack:
            yield SlackPlatform(slack)
    else:
        with FakeDiscord(token=DISCORD_TOKEN) as discord:
            yield DiscordPlatform(discord)


# -- the bot ---------------------------------------------------------------------------------
_runs = itertools.count(1)


@dataclass
class BotProcess:
    """`memgpt-bot run` on one platform, in its own process, with its data in `home`."""

    platform: ChatPlatform
    llm_url: str
    home: Path
    cli: RunningCLI | None = None
    extra: dict[str, str] | None = None

    def env(self) -> dict[str, str]:
        env = base_env(self.llm_url, self.home / "data", MEMGPT_WARM_UP="0", MEMGPT_LOG_LEVEL="DEBUG")
        for name in list(env):
            if name.startswith(("DISCORD_", "SLACK_", "MONGODB_")):
                del env[name]
        return env | self.platform.env() | (self.extra or {})

    def start(self, *, wait_ready: bool = True) -> BotProcess:
        folder = self.home / f"run-{next(_runs)}"
        folder.mkdir(parents=True)
        self.cli = RunningCLI(["run"], env=self.env(), cwd=self.home, folder=folder)
        if wait_ready:
            self.wait_for_line(READY_LINE)
        return self

    @property
    def stderr(self) -> str:
        return self.cli.stderr if self.cli else ""

    def wait_for_line(self, text: str, within: float = 90.0) -> None:
        deadline = time.monotonic() + within
        assert self.cli is not None
        while text not in self.stderr:
            if self.cli.process.exitcode is not None:
                raise AssertionError(f"the bot exited ({self.cli.process.exitcode}) before {text!r}:\n{self.stderr}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the bot did not say {text!r} within {within:.0f} s:\n{self.stderr}")
            time.sleep(0.05)

    def stop(self, within: float = 60.0) -> tuple[int | None, float]:
        """SIGTERM; the exit code (None: still running after `within` s, then killed) and the seconds it took."""
        assert self.cli is not None
        started = time.monotonic()
        self.cli.signal(signal.SIGTERM)
        code = self.cli.wait(within)
        took = time.monotonic() - started
        self.cli.kill()
        return code, took

    def logs(self) -> str:
        """Everything the bot wrote: its standard streams and its log files."""
        texts = [path.read_text(encoding="utf-8", errors="replace") for path in self.home.rglob("*") if _log(path)]
        return "\n".join(texts)


def _log(path: Path) -> bool:
    return path.is_file() and (path.name in ("stdout", "stderr") or re.search(r"\.log(\.\d+)?$", path.name) is not None)
