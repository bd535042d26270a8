"""Each backend plays every storage role, as a type (memory/roles.py): what a
caller checks with isinstance before counting on a role it can do without."""

from __future__ import annotations

import inspect

from memory import roles
from memory.store import Store

ROLES = [
    role
    for _, role in inspect.getmembers(roles, inspect.isclass)
    if role.__module__ == roles.__name__ and getattr(role, "_is_protocol", False)
]


async def test_every_backend_plays_every_role(store: Store) -> None:
    assert len(ROLES) == 13  # ChannelStore the 13th
    missing = [role.__name__ for role in ROLES if not isinstance(store, role)]
    assert missing == []
    assert isinstance(store, Store)


async def test_the_store_hands_out_its_own_schedule_store(store: Store) -> None:
    assert store.schedules is store.schedules
    assert await store.schedules.list_all() == []
