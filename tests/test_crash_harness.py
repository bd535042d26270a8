"""SIGKILL the real bot at 100 random points of a running conversation
(tests/crash_harness.py), restart it each time, and check that nothing was
lost or doubled. MEMGPT_CRASH_KILLS changes the number of kills. Then kills
during start-up with a CPU hog beside the bot (nothing may be given up: no
event was to blame), and a genuine poison event (given up, with a clear reply
to its sender, while everything else is answered once). And kills with
debounce on: batches of quick messages keep the same promises."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from bot.durable.inbox import MAX_RESTARTS
from tests.crash_harness import Report, run

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
    # ... every line said in the listening channel in its memory exactly once ...
    assert report.heard and set(report.heard.values()) == {1}, report.summary()
    assert report.deliveries > report.events  # the kills did land: Slack had to re-deliver


def assert_whole(report: Report, *, except_for: tuple[str, int] | None = None, listened: bool = True) -> None:
    """Every event but `except_for` answered once, every message in recall once, nothing left."""
    answers = {event: count for event, count in report.answers.items() if event != except_for}
    assert Counter(answers.values()) == Counter({1: report.events - (except_for is not None)}), report.summary()
    assert Counter(report.recall.values()) == Counter({1: report.events}), report.summary()
    assert report.facts_ok and report.duplicate_facts == 0, report.summary()
    assert (report.pending_events, report.pending_replies) == (0, 0), report.summary()
    if listened:  # every line said in the listening channel kept once
        assert report.heard and set(report.heard.values()) == {1}, report.summary()


async def test_kills_during_start_up_blame_no_event(tmp_path: Path) -> None:
    # 15 of 25 kills land while the bot starts, before it listens: events it
    # never began count nothing against them. (No CPU hog of its own: the suite
    # keeps the machine busy, and a hog here cost the suite a core for minutes;
    # `python -m tests.crash_harness --hogs 2` runs it beside spinners.)
    report = await run(tmp_path / "data", kills=25, startup_kills=15, users=4, per_user=10, seed=11)
    print(report.summary())
    assert report.problems == [], report.problems[:10]
    assert report.gave_up == Counter(), report.summary()
    assert_whole(report)


async def test_a_poison_event_is_given_up_with_a_clear_reply_and_nothing_else_is(tmp_path: Path) -> None:
    # The bot dies whenever it works on U2's message 3, and at 10 random moments besides.
    report = await run(tmp_path / "data", kills=10, users=4, per_user=8, seed=5, poison=("U2", 3))
    print(report.summary())
    assert report.problems == [], report.problems[:10]
    assert report.gave_up == Counter({"U2": 1}), report.summary()
    assert report.answers[("U2", 3)] == 0, report.summary()
    # The first death may come in company (that only makes it a suspect); then MAX_RESTARTS alone.
    assert 1 <= report.poison_deaths <= MAX_RESTARTS + 1, report.summary()
    assert_whole(report, except_for=("U2", 3))


async def test_sigkill_with_debounce_on_loses_nothing_and_doubles_nothing(tmp_path: Path) -> None:
    # Each user's quick messages become batches (bot/durable/debounce.py): kills land
    # between linking the followers, recording the batch, answering it and finishing it.
    # (No listening channel: its lines between a person's DMs keep their bursts apart.)
    report = await run(tmp_path / "data", kills=25, users=3, per_user=16, seed=12, debounce=0.3, listen=False)
    print(report.summary())
    assert report.kills == 25, report.summary()
    assert report.problems == [], report.problems[:10]
    assert_whole(report, listened=False)  # every message named by exactly one answer, in recall once, nothing left
    assert report.batched > 0, report.summary()  # batches did form
