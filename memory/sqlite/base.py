"""What every part of the SQLite backend builds on: the store's one connection,
used only on its worker thread (memory/sqlite/store.py tells why)."""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class SQLiteDatabase(ABC):
    @abstractmethod
    async def run_in_db(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = False) -> T:
        """Run `fn(connection)` on the store's worker thread, inside one write
        transaction if `write`."""
