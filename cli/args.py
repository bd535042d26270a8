"""Command-line argument types shared by the CLI modules."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bot.events import agent_key, parse_user


@dataclass(frozen=True, slots=True)
class User:
    spec: str  # as typed
    platform: str
    user_id: str

    @property
    def key(self) -> str:
        return agent_key(self.platform, self.user_id)


def user_argument(spec: str) -> User:
    """`--user NAME` or `--user PLATFORM:ID`, checked as argparse expects."""
    try:
        platform, user_id = parse_user(spec.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not user_id:
        raise argparse.ArgumentTypeError("empty user: use NAME or PLATFORM:ID, e.g. discord:1234")
    return User(spec, platform, user_id)
