"""A small bounded cache for what adapters remember of their platform (names,
channels, event ids, warnings already given): the least recently used entries
go first, and, with a ttl, entries older than ttl seconds."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A bounded mapping that forgets the least recently used entries (and, with a
    ttl, entries older than ttl seconds: names and channels do get renamed)."""

    def __init__(self, capacity: int, ttl: float | None = None) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self._items: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        value, stored = item
        if self.ttl is not None and time.monotonic() - stored > self.ttl:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = (value, time.monotonic())
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._items
