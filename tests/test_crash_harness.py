"""SIGKILL the real bot at 100 random points of a running conversation
(tests/crash_harness.py), restart it each time, and check that nothing was
lost or doubled. MEMGPT_CRASH_KILLS changes the number of kills."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from tests.crash_harness import run

KILLS = int(os.environ.get("MEMGPT_CRASH_KILLS", "100"))


async def test_sigkill_at_random_points_loses_nothing_and_doubles_nothing(tmp_path: Path) -> None:
    report = await run(tmp_path / "data", kills=KILLS, users=10, per_user=40, seed=20261130)
    print(report.summary())
    assert report.kills == KILLS, report.summary()
    assert report.problems == [], report.problems[:10]
    # Every event answered exactly once on the platform ...
    assert Counter(report.answers.values()) == Counter({1: report.events}), report.summary()
    # ... every user message in recall storage exactly once ...
    assert Counter(report.recall.values()) == Counter({1: report.events}), report.summary()
    # ... the working context whole, every fact saved once (a save cut short is
    # closed as such at restart, never run blind again), and nothing left behind.
    assert report.facts_ok, report.summary()
    assert report.duplicate_facts == 0, report.summary()
    assert (report.pending_events, report.pending_replies) == (0, 0), report.summary()
    assert report.deliveries > report.events  # the kills did land: Slack had to re-deliver
