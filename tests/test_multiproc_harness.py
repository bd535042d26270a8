"""Three real bots on one MongoDB database behind a random load balancer,
random ones SIGKILLed and restarted, debounce on (tests/multiproc_harness.py):
nothing lost, nothing doubled, every message in recall once.
MEMGPT_MULTIPROC_SEEDS runs more seeds (the CLI runs any number)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from tests.mongo_server import MongoTarget, mongo_target
from tests.multiproc_harness import line, run

__all__ = ["mongo_target"]  # the session fixture, imported to be found here

SEEDS = int(os.environ.get("MEMGPT_MULTIPROC_SEEDS", "2"))


@pytest.mark.parametrize("seed", range(1, SEEDS + 1))
async def test_three_processes_with_kills_lose_nothing_and_double_nothing(
    mongo_target: MongoTarget, tmp_path: Path, seed: int
) -> None:
    database = mongo_target.database_name()
    report = await run(
        tmp_path, uri=mongo_target.uri, database=database, processes=3, kills=8, users=3, per_user=8, seed=seed
    )
    print(line(seed, report))
    assert report.problems == [], report.problems[:10]
    assert report.kills >= 1, line(seed, report)  # the kills did land
    assert Counter(report.answers.values()) == Counter({1: report.events}), line(seed, report)
    assert Counter(report.recall.values()) == Counter({1: report.events}), line(seed, report)
    assert report.heard and set(report.heard.values()) == {1}, line(seed, report)  # each channel line kept once
    assert report.facts_ok and report.duplicate_facts == 0, report.problems
    assert (report.pending_events, report.pending_replies) == (0, 0), line(seed, report)
    assert report.gave_up == Counter(), line(seed, report)  # no event killed the bots: none given up
