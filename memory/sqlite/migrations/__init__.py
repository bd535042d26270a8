"""SQLite schema versioning: an ordered list of small numbered migration
functions, as simonw/llm keeps its own (llm/migrations.py).

Each migration runs once, in list order, inside its own write transaction, and
its name is recorded in the `_migrations` table of the same database. To change
the schema, append a new function named `mNNN_what_it_does` (the next number)
and decorated with `@migration`; never edit, rename or reorder one that has
shipped, because existing databases have already run it.

The first migrations shipped unnumbered (`m_checkin_schedules`...): they are
still recorded under those names (RECORDED_AS), so a database made by any
release, older or newer, runs none of them twice.
"""

from __future__ import annotations

# The modules register their migrations in import order: the order is the schema's history.
from memory.sqlite.migrations import before_places, places_on
from memory.sqlite.migrations.before_places import *  # noqa: F403 - every migration by name, for tests
from memory.sqlite.migrations.places_on import *  # noqa: F403
from memory.sqlite.migrations.registry import MIGRATIONS, RECORDED_AS, Migration, migrate, migration, recorded_name

__all__ = [
    "MIGRATIONS",
    "RECORDED_AS",
    "Migration",
    "before_places",
    "migrate",
    "migration",
    "places_on",
    "recorded_name",
]
