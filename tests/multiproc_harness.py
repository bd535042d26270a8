"""Multi-process crash harness: N real bots (`memgpt-bot run`, Slack in HTTP
mode) on one MongoDB database (FerretDB here), each with its own port and data
folder, as on N machines behind a load balancer. This process plays Slack and
the load balancer: every delivery of an event goes to a random process, and an
event is re-delivered (with the retry header) until one answers 200. Random
processes are SIGKILLed and restarted meanwhile, debounce on, while several
people each send several DMs (the crash harness's conversation and scripted
model: tests/crash_harness.py, tests/crash_script.py).

    python -m tests.multiproc_harness --seeds 10 [--processes 3 --kills 20 --users 6 --messages 12]

Each user's every fourth DM is followed by a line of theirs in a channel the
bots listen in (SLACK_LISTEN_CHANNELS), mentioning nobody: kept, not answered.

Checked at the end: every message named by exactly one post (0 lost, 0
doubled), every message in recall storage exactly once, every channel line in
the channel's memory exactly once (and the listening notice said at most
once), the working context whole facts only, nothing left unfinished in the
inbox or the outbox.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from memory.mongo.blocks import block_from_doc
from tests.crash_harness import (
    LISTEN_CHANNEL,
    SECRET,
    TEAM,
    BotProcess,
    Conversation,
    Report,
    _all_answered,
    check_heard,
    free_port,
    kill_blaming_no_one,
    tally_posts,
)
from tests.crash_script import FACT, MESSAGE, BatchModel, answered_in, scripted_model
from tests.fake_llm import start_fake_llm
from tests.fake_slack import FakeSlack

# The lease heartbeat's life: a killed process's events are taken over by
# the others (or its restart) this long after its last renewal. Short, to keep
# runs short, yet long enough for a heavily loaded machine (3 s lost leases
# at a load average of 17 on 2 cores).
LEASE_TTL = 8.0
# Seconds without a new answer after which the kills stop (something is lost: the checks say what).
STALLED = 120.0


@dataclass
class Cluster:
    bots: list[BotProcess]

    @property
    def ports(self) -> list[int]:
        return [bot.port for bot in self.bots]

    async def start(self) -> None:
        for bot in self.bots:
            bot.start()
        for bot in self.bots:
            await bot.wait_listening()

    def stop(self) -> list[int]:
        return [bot.stop() for bot in self.bots]

    def dead(self) -> list[BotProcess]:
        return [bot for bot in self.bots if bot.process is not None and not bot.process.is_alive()]


def _env(base: dict[str, str], folder: Path, port: int, uri: str, database: str, debounce: float) -> dict[str, str]:
    env = {
        **base,
        "MEMGPT_DATA_DIR": str(folder),
        "SLACK_HTTP_PORT": str(port),
        "MONGODB_URI": uri,
        "MONGODB_DB": database,
        "MEMGPT_LEASES": "on",
        "MEMGPT_LEASE_TTL": str(LEASE_TTL),
        "MEMGPT_LEASE_RENEW": str(LEASE_TTL / 6),
        "MEMGPT_DEBOUNCE_SECONDS": str(debounce),
    }
    env.pop("MEMGPT_LEASE_WAIT", None)
    return env


async def run(
    folder: Path,
    *,
    uri: str,
    database: str,
    processes: int = 3,
    kills: int = 20,
    users: int = 6,
    per_user: int = 12,
    seed: int = 1,
    debounce: float = 0.3,
    max_gap: float = 0.1,
    gap: float = 0.2,
    settle_within: float = 180.0,
) -> Report:
    """Play the conversation across `processes` bots on one MongoDB database,
    SIGKILLing a random one `kills` times (each restarted at once)."""
    rng = random.Random(seed)
    llm = start_fake_llm()
    slack = FakeSlack(bot_token="xoxb-crash-harness", team_id=TEAM).start()
    base = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OPENAI_API_KEY": "crash-harness-key",
        "OPENAI_BASE_URL": llm.base_url,
        "MEMGPT_MODEL": "test-model",
        "MEMGPT_CONTEXT_WINDOW": "32000",
        "MEMGPT_LLM_TIMEOUT": "30",
        "MEMGPT_LLM_MAX_RETRIES": "1",
        "SLACK_BOT_TOKEN": "xoxb-crash-harness",
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_API_URL": slack.api_url,
        "SLACK_HTTP_HOST": "127.0.0.1",
        "SLACK_LISTEN_CHANNELS": LISTEN_CHANNEL,
        "MEMGPT_RATE_LIMIT_PER_MINUTE": "0",
        "MEMGPT_DAILY_TOKEN_BUDGET": "0",
        "MEMGPT_WARM_UP": "off",
    }
    for name in ("DISCORD_TOKEN", "SLACK_APP_TOKEN"):
        base.pop(name, None)
    bots = []
    for n in range(processes):
        data = folder / f"bot{n}"
        data.mkdir(parents=True, exist_ok=True)
        port = free_port()
        bots.append(BotProcess(_env(base, data, port, uri, database, debounce), data / "bot.log", port))
    cluster = Cluster(bots)
    outbox = MongoClient(uri)[database]["outbox"]  # read from the scripted model's thread
    journal = outbox.database["event_journal"]

    def suspect_running() -> bool | None:
        try:
            return journal.find_one({"state": "running", "alone": True}, {"_id": 1}) is not None
        except PyMongoError:
            return None

    def delivered(user: str, number: int) -> bool:
        texts = (str(doc["text"]) for doc in outbox.find({"agent_key": f"slack:{TEAM}:{user}"}, {"text": 1}))
        return any((user, number) in answered_in(text) for text in texts)

    batches = BatchModel(delivered)  # debounce on or off: one post may answer several messages
    llm.set_handler(lambda request: scripted_model(request, None, batches=batches))
    conversation = Conversation(
        [f"U{n}" for n in range(1, users + 1)], per_user, rng, runs=debounce > 0, gap=gap, listen_in=LISTEN_CHANNEL
    )
    expected = len(conversation.events())
    started = time.monotonic()
    done_killing = held_back = 0
    try:
        await cluster.start()
        async with aiohttp.ClientSession() as session:
            player = asyncio.create_task(conversation.play(cluster.ports, session))
            posted_before = 0
            while done_killing < kills and not _all_answered(slack, expected):
                # After a few more events were taken, and once something was
                # answered since the last kill (else, on a slow machine, kills
                # could come faster than any event can finish).
                target = conversation.acked + rng.randint(1, 3)
                while conversation.acked < target and not player.done():  # noqa: ASYNC110 - a counter, polled
                    await asyncio.sleep(0.005)
                if not await _answered_since(slack, posted_before, expected, within=STALLED):
                    break  # nothing answered for that long: the checks say what is missing
                await asyncio.sleep(rng.uniform(0.0, max_gap))
                victim = rng.choice(cluster.bots)
                # Never while a suspect runs alone (anywhere: which process runs it is not known here).
                give_up_at = time.monotonic() + STALLED
                while not (killed := await kill_blaming_no_one(victim, suspect_running)):
                    if time.monotonic() > give_up_at:
                        break
                    held_back += 1
                    await asyncio.sleep(0.02)
                if not killed:
                    break  # a suspect ran for that long: the checks say what is missing
                done_killing += 1
                victim.start()
                posted_before = len(slack.posted_texts())
                await victim.wait_listening()
            await player
        client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(uri)
        try:
            db = client[database]
            await _settle(slack, db, expected, within=settle_within)
            exit_codes = cluster.stop()
            report = Report(done_killing, expected, conversation.deliveries, sum(b.starts for b in bots), 0.0)
            report.seconds, report.held_back = time.monotonic() - started, held_back
            report.problems += [f"a bot exited with {code} on SIGTERM" for code in exit_codes if code != 0]
            await _check(report, slack, db, conversation)
        finally:
            await client.close()
        return report
    finally:
        for bot in cluster.bots:
            if bot.process is not None and bot.process.is_alive():
                bot.kill()
        outbox.database.client.close()
        slack.stop()
        llm.stop()


async def _answered_since(slack: FakeSlack, posted: int, expected: int, within: float) -> bool:
    """Until something more than `posted` posts was answered (or all was); False after `within` s."""
    deadline = time.monotonic() + within
    while len(slack.posted_texts()) == posted and not _all_answered(slack, expected):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def _unfinished(db: object) -> tuple[int, int]:
    journal = await db["event_journal"].count_documents({"state": {"$ne": "done"}})  # type: ignore[index]
    outbox = await db["outbox"].count_documents({"state": "pending"})  # type: ignore[index]
    return int(journal), int(outbox)


async def _settle(slack: FakeSlack, db: object, expected: int, within: float) -> None:
    """Until every message is answered and the inbox and outbox are through
    (dead processes' rows are taken over within the lease ttl plus a round),
    or time runs out (then the checks say what is missing)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _all_answered(slack, expected) and await _unfinished(db) == (0, 0):
            await asyncio.sleep(1.0)  # let a duplicate, if any, arrive too
            return
        await asyncio.sleep(0.2)


async def _check(report: Report, slack: FakeSlack, db: object, conversation: Conversation) -> None:
    tally_posts(report, slack)
    for user, number, _ in conversation.events():
        report.answers.setdefault((user, number), 0)
        report.recall.setdefault((user, number), 0)
    keys = {doc["_id"]: str(doc["key"]) async for doc in db["agents"].find({}, {"key": 1})}  # type: ignore[index]
    async for doc in db["messages"].find({"role": "user", "name": "user_message"}):  # type: ignore[index]
        found = MESSAGE.search(str(doc.get("content") or ""))
        if found:
            report.recall[(found.group(1), int(found.group(2)))] += 1
    async for doc in db["blocks"].find({"label": "human"}):  # type: ignore[index]
        user = keys.get(doc["agent_id"], "?").rsplit(":", 1)[-1]
        facts = Counter(FACT.findall(block_from_doc(doc).value))
        if any(owner != user for owner, _ in facts):
            report.facts_ok = False
            report.problems.append(f"working context of {user} holds another user's facts")
        report.duplicate_facts += sum(count - 1 for count in facts.values())
        missing = {(user, str(n)) for n in range(0, conversation.per_user, 4)} - set(facts)
        if missing:
            report.facts_ok = False
            report.problems.append(f"working context of {user} lost facts {sorted(missing)[:5]}")
    memory_key = f"channel:slack:{TEAM}:{LISTEN_CHANNEL}"
    channel = next((agent_id for agent_id, key in keys.items() if key == memory_key), None)
    lines = db["messages"].find({"agent_id": channel}, {"content": 1})  # type: ignore[index]
    check_heard(report, conversation, [str(doc.get("content") or "") async for doc in lines])
    troubled = set(report.unexpected)
    for (user, number), count in sorted(report.answers.items()):
        if count != 1:
            report.problems.append(f"{user}'s message {number} answered {count} times")
            troubled.add(user)
    for user in sorted(troubled):
        report.problems += await _story(db, slack, user, keys)
    for (user, number), count in sorted(report.recall.items()):
        if count != 1:
            report.problems.append(f"{user}'s message {number} in recall {count} times")
    report.pending_events, report.pending_replies = await _unfinished(db)


async def _story(db: object, slack: FakeSlack, user: str, keys: dict[object, str]) -> list[str]:
    """How a user's messages went: recall order (event ids; ~ marks tool and
    assistant steps), their outbox entries, the posts (with the outbox id each carried)."""
    key = f"slack:{TEAM}:{user}"
    agent = next((agent_id for agent_id, k in keys.items() if k == key), None)
    steps = []
    async for doc in db["messages"].find({"agent_id": agent}).sort("seq", 1):  # type: ignore[index]
        if doc["role"] == "user":
            steps.append(str(doc.get("event_id") or "?").removeprefix(f"Ev{user}N"))
        elif doc["role"] == "assistant" and "send_message" in str(doc.get("tool_calls")):
            found = [str(n) for _, n in answered_in(str(doc.get("tool_calls")).split('"message": "')[-1].split('"')[0])]
            steps.append(f"send({' '.join(found)})")
    outbox = [
        f"{doc['_id']}={doc['text']!r}({doc['state']})"
        async for doc in db["outbox"].find({"agent_key": key}).sort("created_at", 1)  # type: ignore[index]
    ]
    inbox = [
        f"{doc['_id']}:{doc['state']},{doc.get('attempts')},{doc.get('absorbed_into') or '-'}"
        async for doc in db["event_journal"].find({"agent_key": key}).sort("n", 1)  # type: ignore[index]
    ]
    posts = []
    for call in slack.calls_to("chat.postMessage"):
        if call.args.get("channel") == f"D{user}":
            metadata = call.args.get("metadata") or {}
            payload = (json.loads(metadata) if isinstance(metadata, str) else metadata).get("event_payload") or {}
            posts.append(f"{call.args.get('text')!r}<-{payload.get('outbox_id', '?')}")
    return [
        f"  {user} recall: {' '.join(steps)}",
        f"  {user} outbox: {' '.join(outbox)}",
        f"  {user} inbox: {' '.join(inbox)}",
        f"  {user} posts: {' '.join(posts)}",
    ]


def line(seed: int, report: Report) -> str:
    """One run's result, for the report: lost / doubled / recall not once."""
    lost = sum(1 for count in report.answers.values() if count == 0)
    doubled = sum(1 for count in report.answers.values() if count > 1)
    recall = sum(1 for count in report.recall.values() if count != 1)
    return (
        f"seed {seed}: {report.events} messages, {report.kills} kills, {report.deliveries} deliveries, "
        f"{report.seconds:.0f} s: lost {lost}, doubled {doubled}, recall not once {recall}, "
        f"channel lines heard {len(report.heard)}: lost {sum(1 for c in report.heard.values() if c == 0)}, "
        f"kept twice {sum(1 for c in report.heard.values() if c > 1)}, "
        f"given up {sum(report.gave_up.values())}, batched posts {report.batched}, "
        f"kills put off while a suspect ran alone {report.held_back}, "
        f"left unfinished {report.pending_events}+{report.pending_replies}, facts whole {report.facts_ok}"
    )


async def _main(args: argparse.Namespace, seeds: Sequence[int]) -> int:
    from tests.mongo_server import start_target

    target = start_target()
    failed = 0
    try:
        for seed in seeds:
            database = f"memgpt_multiproc_{uuid.uuid4().hex[:8]}"
            report = await run(
                args.folder / f"seed{seed}",
                uri=target.uri,
                database=database,
                processes=args.processes,
                kills=args.kills,
                users=args.users,
                per_user=args.messages,
                seed=seed,
                debounce=args.debounce,
            )
            print(line(seed, report), flush=True)
            for problem in report.problems[:40]:
                print("  -", problem, flush=True)
            failed += bool(report.problems)
            client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(target.uri)
            await client.drop_database(database)
            await client.close()
    finally:
        target.close()
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--messages", type=int, default=12, help="messages per user")
    parser.add_argument("--seeds", type=int, default=10, help="runs, seeds 1..N")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--debounce", type=float, default=0.3)
    parser.add_argument("--folder", type=Path, default=Path(f"/tmp/multiproc-harness-{uuid.uuid4().hex[:8]}"))
    args = parser.parse_args()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    failed = asyncio.run(_main(args, seeds))
    print(f"{len(seeds) - failed} of {len(seeds)} runs whole")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
