"""The chat platforms the adapter conformance suite (tests/conformance/test_adapters.py)
runs over: each is the stand-in for a platform's servers (tests/fake_slack.py,
tests/fake_discord.py) and what a person does there, in one small driver, so that
every test reads the same on every platform. The bot itself is `memgpt-bot run` in
its own process (`BotProcess`), talking to the stand-in through the platform's real
client library (slack-bolt / slack-sdk in Socket Mode; discord.py's gateway and HTTP).

People: "alice" (a member of the private channel) and "bob". Places: "dm:<person>",
"public" and "private".
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
    def command(self, person: str, name: str) -> None:
        """`person` runs the slash command `/name` in their DMs."""
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
        self.ids = {"alice": "U1", "bob": "U2"}
        for person, user_id in self.ids.items():
            slack.add_user(user_id, person.title())
        slack.add_channel("C1", "general")
        slack.add_channel("G1", "team", private=True)
        self.channels = {"public": "C1", "private": "G1"}

    def env(self) -> dict[str, str]:
        return {
            "SLACK_BOT_TOKEN": self.slack.bot_token,
            "SLACK_APP_TOKEN": self.slack.app_token,
            "SLACK_API_URL": self.slack.api_url,
        }

    def _channel(self, place: str) -> str:
        return f"D{self.ids[place[3:]]}" if place.startswith("dm:") else self.channels[place]

    def _send(self, event: dict[str, Any]) -> dict[str, Any]:
        body = {
            "token": "legacy-verification-token",
            "team_id": self.slack.team_id,
            "api_app_id": "A1",
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{uuid.uuid4().hex[:12].upper()}",
            "event_time": int(time.time()),
            "authorizations": [{"team_id": self.slack.team_id, "user_id": self.slack.bot_user_id, "is_bot": True}],
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
        channel, user = self._channel(place), self.ids[person]
        message = self.slack.add_message(channel, user, f"<@{self.slack.bot_user_id}> {text}")
        where = {"channel": channel, "team": self.slack.team_id}
        sent = self._send(message | where | {"type": "app_mention"})
        self._send(message | where | {"channel_type": "channel" if place == "public" else "group"})
        return sent

    def say(self, place: str, person: str, text: str) -> Any:
        channel, user = self._channel(place), self.ids[person]
        message = self.slack.add_message(channel, user, text)
        kind = "channel" if place == "public" else "group"
        return self._send(message | {"channel": channel, "channel_type": kind, "team": self.slack.team_id})

    def redeliver(self, sent: Any) -> None:
        # Slack retries an event it thinks was not acknowledged: the same event_id.
        self.wait_until(lambda: self.slack.socket_connected, 60)
        self.slack.send_socket_event(sent, retry_attempt=1, retry_reason="timeout")

    def command(self, person: str, name: str) -> None:
        user = self.ids[person]
        payload = {
            "token": "legacy-verification-token",
            "team_id": self.slack.team_id,
            "channel_id": f"D{user}",
            "user_id": user,
            "command": f"/{name}",
            "text": "",
            "api_app_id": "A1",
            "response_url": self.slack.response_url(person),
            "trigger_id": uuid.uuid4().hex,
        }
        self.wait_until(lambda: self.slack.socket_connected, 60)
        self.slack.send_socket_event(payload, envelope_type="slash_commands")

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
        }
        self.channels = {"public": discord.public_channel, "private": discord.private_channel}

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

    def command(self, person: str, name: str) -> None:
        self._connected()
        self.discord.slash_command(self.people[person], name)

    def private_answers(self, person: str) -> list[str]:
        # The bot defers (thinking, ephemeral), then sends the answer as a follow-up.
        answers = []
        for callback in self.discord.interaction_callbacks:
            data = callback.get("data") or {}
            if callback.get("type") == "followup" and int(data.get("flags") or 0) & 64:
                answers.append(str(data.get("content", "")))
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
