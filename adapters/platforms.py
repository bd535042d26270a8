"""The platforms `memgpt-bot run` can serve: the registry, one line each.

Each names its package, which offers `plan(bot, env)`: its adapter, built from
the environment, and how it connects; or None and why it is skipped (no
credentials). A package is imported only when planned, so a platform whose
library is missing from the install is skipped, not fatal (cli/app.py). A new
platform is its package (parse, send, a client: the contract in
adapters/pipeline.py) and one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from bot.ports import AdapterPort

PLATFORMS: dict[str, str] = {
    "discord": "adapters.discord",
    "slack": "adapters.slack",
}


def plan_platform(name: str, bot: AdapterPort, env: Mapping[str, str]) -> tuple[Any, str]:
    """The platform's adapter on `bot` (None when it is not configured) and the reason."""
    adapter, reason = importlib.import_module(PLATFORMS[name]).plan(bot, env)
    return adapter, str(reason)
