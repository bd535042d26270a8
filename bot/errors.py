"""The error every settings reader raises: in its own module, so that the
modules whose settings bot/config.py gathers (check-ins, leases) can raise it
without importing bot/config.py back."""

from __future__ import annotations


class ConfigError(Exception):
    """A setting is missing or malformed; the message says which and how to fix it."""
