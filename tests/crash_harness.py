"""Crash harness: the real bot (`memgpt-bot run`, Slack in HTTP mode) as a
subprocess against the scripted LLM and the fake Slack Web API, killed with
SIGKILL at random points while a scripted conversation runs, restarted each
time; then every promise of bot/durable/inbox.py is checked.

    python -m tests.crash_harness --kills 100 --users 8 --messages 30 [--debounce 0.3]

The conversation: each user sends numbered messages ("msg U3 17"); the
scripted model answers "re: U3 17" with send_message, and every fourth
message first saves a fact "[U3:16]" to working context (a two-step chain,
so kills also land between steps). This process plays Slack: it re-delivers
an event (with the retry header) until the bot acknowledges it.

Checked at the end: every event answered exactly once on the platform; every
user message in recall storage exactly once; the working context made of whole
facts only; nothing left pending in the inbox or the outbox.

With `--debounce SECONDS` (MEMGPT_DEBOUNCE_SECONDS, bot/durable/debounce.py) a
user's quick messages become one event; the scripted model (tests/crash_script.py)
then answers all it sees unanswered at once ("re: U3 15 16 17"), and "answered
exactly once" means each message is named by exactly one post.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.process
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bot.channels.listening import LISTENING_NOTICE
from bot.durable.inbox import GAVE_UP
from memory.types import Block, join_lines
from tests.crash_script import FACT, MESSAGE, BatchModel, answered_in, scripted_model
from tests.fake_llm import start_fake_llm
from tests.fake_slack import FakeSlack, signature_headers
from tests.forks import FORKS
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
SECRET = "crash-harness-signing-secret"
TEAM = "T1"
# The channel the bot listens in, and how often a user speaks there (each line kept once across the kills).
LISTEN_CHANNEL = "CLISTEN"
LISTEN_EVERY = 4  # a user's every fourth DM is followed by a line of theirs in the listening channel
HEARD = re.compile(r"heard (U\d+) (\d+)")


# --------------------------------------------------------------------------- the bot process


def _run_bot(env: dict[str, str], log_path: str) -> None:
    """The child: `memgpt-bot run` with this environment, output to the log."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    with open(log_path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    from cli.main import main

    main(["run"])


# Each start forks from the tests' fork server (tests/forks.py), where the
# bot's modules are imported once: a real new process without seconds of
# imports per restart, which 100 restarts would multiply.
_FORKS = FORKS


@dataclass
class BotProcess:
    env: dict[str, str]
    log_path: Path
    port: int
    process: multiprocessing.process.BaseProcess | None = None
    starts: int = 0

    def start(self) -> None:
        self.process = _FORKS.Process(target=_run_bot, args=(self.env, str(self.log_path)), daemon=True)
        self.process.start()
        self.starts += 1

    async def wait_listening(self, within: float = 180.0, *, revive: bool = False) -> None:
        """Until the bot accepts connections; with `revive`, a bot that died
        meanwhile (the poison event) is started again, as a supervisor would."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            assert self.process is not None
            if not self.process.is_alive():
                if not revive:
                    raise RuntimeError(f"the bot exited with {self.process.exitcode}; see {self.log_path}")
                self.process.join()
                self.start()
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.02)
        raise RuntimeError(f"the bot did not listen within {within} s; see {self.log_path}")

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.process is not None
        self.process.join()

    def signal(self, number: signal.Signals) -> None:
        assert self.process is not None and self.process.pid is not None
        # It may be dead already (the poison event killed it), reaped by the fork server.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, number)

    def stop(self) -> int:
        assert self.process is not None and self.process.pid is not None
        os.kill(self.process.pid, signal.SIGTERM)
        self.process.join(timeout=60)
        return -1 if self.process.exitcode is None else self.process.exitcode


SuspectRunning = Callable[[], bool | None]  # None: could not tell


async def kill_blaming_no_one(bot: BotProcess, suspect_running: SuspectRunning) -> bool:
    """SIGKILL `bot` unless an event suspected of stopping the bot runs alone
    (bot/durable/inbox.py: Quarantine): a death then is, by design, evidence against
    that event, and a kill from outside is none (on a busy machine a start-up
    can be over before a kill timed for it lands, and four such kills gave an
    innocent event up). The bot is frozen (SIGSTOP) while its inbox is read,
    so nothing it does comes between the look and the kill: a run it had not
    yet written down dies unwritten. False (and the bot let go) if one runs,
    or if the inbox could not be read."""
    bot.signal(signal.SIGSTOP)
    try:
        innocent = await asyncio.to_thread(suspect_running) is False
    except BaseException:
        bot.signal(signal.SIGCONT)
        raise
    if not innocent:
        bot.signal(signal.SIGCONT)
        return False
    bot.kill()
    return True


def sqlite_suspect_running(db: Path) -> SuspectRunning:
    """Whether the bot's SQLite inbox has an event running alone (None: not readable now)."""

    def look() -> bool | None:
        return _journal_has(db, "alone AND state = 'running'")

    return look


# --------------------------------------------------------------------------- playing Slack


@dataclass
class Conversation:
    users: list[str]
    per_user: int
    rng: random.Random
    acked: int = 0
    deliveries: int = 0  # POSTs, retries included
    # Each user sends runs of 1 to 4 messages in a row (for debounce to batch), not one at a time.
    runs: bool = False
    gap: float = 0.03  # at most this many seconds between one event's acknowledgement and the next event
    # A channel the bots listen in (SLACK_LISTEN_CHANNELS): after every LISTEN_EVERY-th DM of a
    # user, a message of theirs there, mentioning nobody: kept in the channel's memory, never answered.
    listen_in: str = ""

    def events(self) -> list[tuple[str, int, str]]:
        """(user, number, event id), users interleaved, each user's in order."""
        if not self.runs:
            return [(user, n, f"Ev{user}N{n:04d}") for n in range(self.per_user) for user in self.users]
        lengths = random.Random(self.per_user)  # the same order every time it is asked for
        ordered, sent = [], dict.fromkeys(self.users, 0)
        while any(count < self.per_user for count in sent.values()):
            for user in self.users:
                run = min(lengths.randint(1, 4), self.per_user - sent[user])
                ordered += [(user, n, f"Ev{user}N{n:04d}") for n in range(sent[user], sent[user] + run)]
                sent[user] += run
        return ordered

    def heard(self) -> list[tuple[str, int, str]]:
        """The messages said in the listening channel: (user, number, event id)."""
        if not self.listen_in:
            return []
        return [(user, n, f"Ev{user}L{n:04d}") for user, n, _ in self.events() if n % LISTEN_EVERY == 0]

    async def play(self, port: int | Sequence[int], session: aiohttp.ClientSession) -> None:
        """Deliver every event, each attempt to a random one of `port` (a load balancer)."""
        ports = [port] if isinstance(port, int) else list(port)
        heard = {(user, n) for user, n, _ in self.heard()}
        for user, number, event_id in self.events():
            direct = _message(f"D{user}", "im", user, f"msg {user} {number}", number)
            await self._deliver(direct, event_id, ports, session)
            if (user, number) in heard:  # its ts unique in the channel: the line's message id
                ts_number = self.users.index(user) * 10_000 + number
                event = _message(self.listen_in, "channel", user, f"heard {user} {number}", ts_number)
                await self._deliver(event, f"Ev{user}L{number:04d}", ports, session)

    async def _deliver(
        self, event: dict[str, Any], event_id: str, ports: Sequence[int], session: aiohttp.ClientSession
    ) -> None:
        body = json.dumps(
            {
                "token": "x",
                "team_id": TEAM,
                "api_app_id": "A1",
                "event": event,
                "type": "event_callback",
                "event_id": event_id,
                "event_time": int(time.time()),
            }
        )
        attempt = 0
        while True:  # Slack re-delivers until it gets a 2xx
            headers = {"Content-Type": "application/json", **signature_headers(body, SECRET)}
            if attempt:
                headers |= {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_error"}
            self.deliveries += 1
            url = f"http://127.0.0.1:{self.rng.choice(ports) if len(ports) > 1 else ports[0]}/slack/events"
            try:
                async with session.post(
                    url, data=body.encode(), headers=headers, timeout=aiohttp.ClientTimeout(total=3)
                ) as response:
                    if 200 <= response.status < 300:
                        break
            except (aiohttp.ClientError, TimeoutError):
                pass
            attempt += 1
            await asyncio.sleep(0.05)
        self.acked += 1
        await asyncio.sleep(self.rng.uniform(0.0, self.gap))


def _message(channel: str, channel_type: str, user: str, text: str, number: int) -> dict[str, Any]:
    """A Slack `message` event of `user` in `channel`."""
    return {
        "type": "message",
        "channel_type": channel_type,
        "channel": channel,
        "user": user,
        "team": TEAM,
        "text": text,
        "ts": f"{int(time.time())}.{number:06d}",
    }


# --------------------------------------------------------------------------- the run


@dataclass
class Report:
    kills: int
    events: int
    deliveries: int
    starts: int
    seconds: float
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)
    recall: Counter[tuple[str, int]] = field(default_factory=Counter)
    facts_ok: bool = True
    duplicate_facts: int = 0
    interrupted_calls: int = 0
    pending_events: int = 0
    pending_replies: int = 0
    poison_deaths: int = 0  # the bot killed while it worked on the poison event
    held_back: int = 0  # kills put off because a suspect ran alone (kill_blaming_no_one)
    batched: int = 0  # posts that answered several messages at once (debounce on)
    gave_up: Counter[str] = field(default_factory=Counter)  # "could not process" notices, by user
    unexpected: Counter[str] = field(default_factory=Counter)  # posts that are neither answers nor notices, by user
    heard: Counter[tuple[str, int]] = field(default_factory=Counter)  # lines in the channel's memory: each once
    listening_notices: int = 0  # the channel's "I keep what is said here": at most once
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        wrong_answers = sum(1 for count in self.answers.values() if count != 1)
        wrong_recall = sum(1 for count in self.recall.values() if count != 1)
        return (
            f"crash harness: {self.kills} SIGKILLs, {self.starts} starts, {self.events} events "
            f"({self.deliveries} deliveries with retries) in {self.seconds:.0f} s; "
            f"events not answered exactly once: {wrong_answers}; user messages not in recall exactly once: "
            f"{wrong_recall}; working context whole: {self.facts_ok} ({self.duplicate_facts} facts saved twice); "
            f"calls cut short by a kill and closed at restart: {self.interrupted_calls}; "
            f"left pending: {self.pending_events} events, {self.pending_replies} replies; "
            f"given up (notices by user): {dict(sorted(self.gave_up.items()))} "
            f"after {self.poison_deaths} deaths on the poison event; "
            f"answers to several messages at once: {self.batched}; "
            f"kills put off while a suspect ran alone: {self.held_back}; "
            f"listening channel lines not kept exactly once: {sum(1 for c in self.heard.values() if c != 1)} "
            f"of {len(self.heard)}"
        )


async def run(
    data_dir: Path,
    *,
    kills: int,
    users: int,
    per_user: int,
    seed: int,
    max_gap: float = 0.08,
    startup_kills: int = 0,
    poison: tuple[str, int] | None = None,
    hogs: int = 0,
    debounce: float = 0.0,
    listen: bool = True,
) -> Report:
    """Play the conversation, SIGKILLing the bot `kills` times (the first
    `startup_kills` of them during start-up, before it listens) and
    restarting it. With `poison` (user, message number), the bot is also
    killed whenever the model is asked about that message, as if the event
    itself crashed it. `hogs` processes spin on the CPU meanwhile. `debounce`:
    MEMGPT_DEBOUNCE_SECONDS (0: off). `listen`: users also speak in a channel the
    bot listens in (each line kept once)."""
    rng = random.Random(seed)
    llm = start_fake_llm()
    slack = FakeSlack(bot_token="xoxb-crash-harness", team_id=TEAM).start()
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OPENAI_API_KEY": "crash-harness-key",
        "OPENAI_BASE_URL": llm.base_url,
        "MEMGPT_MODEL": "test-model",
        "MEMGPT_CONTEXT_WINDOW": "32000",
        "MEMGPT_DATA_DIR": str(data_dir),
        # Generous: on a busy machine the local scripted server can take seconds to answer.
        "MEMGPT_LLM_TIMEOUT": "30",
        "MEMGPT_LLM_MAX_RETRIES": "1",
        "SLACK_BOT_TOKEN": "xoxb-crash-harness",
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_API_URL": slack.api_url,
        "SLACK_HTTP_HOST": "127.0.0.1",
        "SLACK_HTTP_PORT": str(port),
        "SLACK_LISTEN_CHANNELS": LISTEN_CHANNEL,
        # The conversation is a burst far above any sane per-user rate: no limits here.
        "MEMGPT_RATE_LIMIT_PER_MINUTE": "0",
        "MEMGPT_DAILY_TOKEN_BUDGET": "0",
        # Nothing here searches by meaning: a hundred starts need not load the model.
        "MEMGPT_WARM_UP": "off",
        "MEMGPT_DEBOUNCE_SECONDS": str(debounce),
    }
    for name in ("DISCORD_TOKEN", "SLACK_APP_TOKEN", "MONGODB_URI"):
        env.pop(name, None)
    bot = BotProcess(env, data_dir / "bot.log", port)
    poison_deaths = held_back = 0

    def kill_on_poison(user: str, number: int) -> None:
        nonlocal poison_deaths
        if (user, number) == poison and bot.process is not None and bot.process.pid is not None:
            poison_deaths += 1
            with contextlib.suppress(ProcessLookupError):  # a random kill got there first
                os.kill(bot.process.pid, signal.SIGKILL)

    poisoned = kill_on_poison if poison else None
    batches = BatchModel() if debounce > 0 else None
    llm.set_handler(lambda request: scripted_model(request, poisoned, batches=batches))
    people = [f"U{n}" for n in range(1, users + 1)]
    conversation = Conversation(people, per_user, rng, runs=debounce > 0, listen_in=LISTEN_CHANNEL if listen else "")
    started = time.monotonic()
    done_killing = 0
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: ASYNC220 - started once, killed below
        for _ in range(hogs)
    ]
    restarting = asyncio.Lock()  # the kills below and the poison watcher restart the bot in turn
    suspect_running = sqlite_suspect_running(data_dir / "memgpt.sqlite3")

    async def restart_the_dead() -> None:
        """A bot that died on its own (the poison event) is started again, as a supervisor would."""
        while True:
            await asyncio.sleep(0.05)
            async with restarting:
                if bot.process is not None and not bot.process.is_alive():
                    await bot.wait_listening(revive=True)

    try:
        data_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before anything runs
        bot.start()
        await bot.wait_listening(revive=poison is not None)
        start_up = await _warm_start_time(bot) if startup_kills else 0.0
        posted_at_start = 0
        expected = len(conversation.events()) - (poison is not None)
        watcher = asyncio.create_task(restart_the_dead())
        async with aiohttp.ClientSession() as session:
            player = asyncio.create_task(conversation.play(port, session))
            while done_killing < kills:
                if done_killing < startup_kills:
                    # During start-up, before the bot listens (within as long
                    # as a restart takes to listen): the inbox holds
                    # unfinished events, the bot is still loading.
                    await asyncio.sleep(rng.uniform(0.0, start_up))
                else:
                    # Kill while work is going on: after a few more events were
                    # taken, at a random moment of what follows (receiving,
                    # calling the model, saving, posting the answer). And only
                    # once this start answered something: on a slow enough
                    # machine kills would otherwise come faster than any event
                    # can finish, and no design could both answer everything
                    # and give up an event that really stops the bot.
                    target = conversation.acked + rng.randint(1, 4)
                    while conversation.acked < target and not player.done():  # noqa: ASYNC110 - a counter, polled
                        await asyncio.sleep(0.002)
                    # Bounded: a start that never answers again (an event lost) ends the
                    # kills, and the check below says what is missing, instead of a hang.
                    stalled = time.monotonic() + STALL_LIMIT
                    while len(slack.posted_texts()) == posted_at_start and not _all_answered(slack, expected):
                        if time.monotonic() > stalled:
                            break
                        await asyncio.sleep(0.005)
                    # Nor while an event suspected of stopping the bot runs alone
                    # (bot/durable/inbox.py: Quarantine): a kill then is, by design, the
                    # evidence against it, and on a busy machine a restart's
                    # first answer (a reply re-sent from the outbox) can come
                    # while the suspect still runs: four such kills gave a
                    # legitimate event up. The poison event kills the bot itself.
                    while await asyncio.to_thread(_suspects_waiting, data_dir / "memgpt.sqlite3"):
                        if time.monotonic() > stalled:
                            break
                        await asyncio.sleep(0.02)
                    if time.monotonic() > stalled:
                        break
                    await asyncio.sleep(rng.uniform(0.0, max_gap))
                # Never while a suspect runs alone (kill_blaming_no_one): a
                # kill timed for a start-up may come once the replays run.
                killed, stalled = False, time.monotonic() + STALL_LIMIT
                while not killed and time.monotonic() < stalled:
                    async with restarting:
                        killed = await kill_blaming_no_one(bot, suspect_running)
                        if killed:
                            done_killing += 1
                            bot.start()
                            if done_killing >= startup_kills:
                                await bot.wait_listening(revive=poison is not None)
                            posted_at_start = len(slack.posted_texts())
                    if not killed:
                        held_back += 1
                        await asyncio.sleep(0.02)  # outside the lock: a poison death is restarted meanwhile
                if not killed:
                    break
            async with restarting:
                await bot.wait_listening(revive=poison is not None)
            await player
            total = len(conversation.events())
            await _settle(slack, expected, within=300.0)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        async with restarting:
            exit_code = bot.stop()
        report = Report(done_killing, total, conversation.deliveries, bot.starts, time.monotonic() - started)
        report.poison_deaths, report.held_back = poison_deaths, held_back
        if exit_code != 0:
            report.problems.append(f"the bot exited with {exit_code} on SIGTERM")
        _check(report, slack, data_dir / "memgpt.sqlite3", conversation)
        return report
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        if bot.process is not None and bot.process.is_alive():
            bot.kill()
        slack.stop()
        llm.stop()


async def _warm_start_time(bot: BotProcess) -> float:
    """How long a restart takes to listen, measured on a graceful one before
    anything is sent. The first start is no guide: it includes the fork
    server's own start (seconds of imports), a restart a fraction of a second,
    and kills paced on the first would mostly land after the bot listens."""
    exit_code = bot.stop()
    assert exit_code == 0, f"the bot exited with {exit_code} on SIGTERM; see {bot.log_path}"
    began = time.monotonic()
    bot.start()
    await bot.wait_listening()
    return time.monotonic() - began


# How long one start may go without answering anything before the harness stops killing.
STALL_LIMIT = 240.0


def _suspects_waiting(db: Path) -> bool:
    """Whether the inbox holds an unfinished event marked to run alone (or could not be read)."""
    return _journal_has(db, "alone AND state <> 'done'") is not False


def _journal_has(db: Path, condition: str) -> bool | None:
    """Whether a row of the inbox meets `condition`: False before the inbox
    exists, None if it could not be read (busy, say)."""
    if not db.exists():
        return False
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.OperationalError:
        return None
    try:
        exists = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'event_journal'").fetchone()
        if exists is None:
            return False
        return conn.execute(f"SELECT 1 FROM event_journal WHERE {condition} LIMIT 1").fetchone() is not None
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()


def _all_answered(slack: FakeSlack, expected: int) -> bool:
    return len({asked for text in slack.posted_texts() for asked in answered_in(text)}) >= expected


async def _settle(slack: FakeSlack, expected: int, within: float) -> None:
    """Wait until every event has an answer (or time runs out; the checks then say what is missing)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _all_answered(slack, expected):
            await asyncio.sleep(1.0)  # let a duplicate, if any, arrive too
            return
        await asyncio.sleep(0.1)


def tally_posts(report: Report, slack: FakeSlack) -> None:
    """Count what the bot posted: the messages each answer names, give-up notices, anything else."""
    for call in slack.calls_to("chat.postMessage"):
        text = str(call.args.get("text", ""))
        user = str(call.args.get("channel", "")).removeprefix("D")  # a DM channel: "D" + the user
        asked = answered_in(text)
        if asked:
            report.answers.update(asked)
            report.batched += len(asked) > 1
        elif text == GAVE_UP:
            report.gave_up[user] += 1
        elif text == LISTENING_NOTICE and not user.startswith("U"):  # said in the channel, not to a person
            report.listening_notices += 1
        else:
            report.unexpected[user] += 1
            report.problems.append(f"unexpected post to {user}: {text[:80]!r}")


def check_heard(report: Report, conversation: Conversation, kept: Sequence[str]) -> None:
    """The listening channel's memory (`kept`: its lines' texts) holds each line said there
    once, and nothing else; its notice was said at most once."""
    for user, number, _ in conversation.heard():
        report.heard.setdefault((user, number), 0)
    for text in kept:
        found = HEARD.fullmatch(text)
        if found is None or (found.group(1), int(found.group(2))) not in report.heard:
            report.problems.append(f"the channel's memory holds {text[:80]!r}")
            continue
        report.heard[(found.group(1), int(found.group(2)))] += 1
    for (user, number), count in sorted(report.heard.items()):
        if count != 1:
            report.problems.append(f"{user}'s channel line {number} kept {count} times")
    if report.listening_notices > 1:
        report.problems.append(f"the listening notice was said {report.listening_notices} times")


def _check(report: Report, slack: FakeSlack, db: Path, conversation: Conversation) -> None:
    tally_posts(report, slack)
    conn = sqlite3.connect(db)
    try:
        for user, number, _ in conversation.events():
            report.answers.setdefault((user, number), 0)
            report.recall.setdefault((user, number), 0)
        rows = conn.execute(
            "SELECT a.key, m.content FROM messages m JOIN agents a ON a.id = m.agent_id"
            " WHERE m.role = 'user' AND m.name = 'user_message'"
        ).fetchall()
        for _key, content in rows:
            found = MESSAGE.search(content or "")
            if found:
                report.recall[(found.group(1), int(found.group(2)))] += 1
        for key, lines in conn.execute(
            "SELECT a.key, b.lines FROM blocks b JOIN agents a ON a.id = b.agent_id WHERE b.label = 'human'"
        ).fetchall():
            value = join_lines(Block.lines_from_json(lines))
            user = key.rsplit(":", 1)[-1]
            facts = FACT.findall(value)
            leftover = FACT.sub("", value).strip()
            # Whole facts only, each one of this user's, nothing half-written.
            if any(owner != user for owner, _ in facts) or (leftover and not _is_default_human(leftover)):
                report.facts_ok = False
                report.problems.append(f"working context of {key} is not whole facts: {value[-200:]!r}")
            counts = Counter(facts)
            report.duplicate_facts += sum(count - 1 for count in counts.values())
            expected = {(user, str(n)) for n in range(0, conversation.per_user, 4)}
            missing = expected - set(counts)
            if missing:
                report.facts_ok = False
                report.problems.append(f"working context of {key} lost facts {sorted(missing)[:5]}")
        kept = conn.execute(
            "SELECT m.content FROM messages m JOIN agents a ON a.id = m.agent_id WHERE a.key = ?",
            (f"channel:slack:{TEAM}:{LISTEN_CHANNEL}",),
        ).fetchall()
        check_heard(report, conversation, [str(content or "") for (content,) in kept])
        troubled = set(report.unexpected)
        for (user, number), count in sorted(report.answers.items()):
            if count > 1 or (count == 0 and user not in report.gave_up):
                report.problems.append(f"{user}'s message {number} answered {count} times")
                troubled.add(user)
        for user in sorted(troubled):
            report.problems += _story(conn, user, slack)
        report.interrupted_calls = conn.execute(
            "SELECT count(*) FROM messages WHERE role = 'tool' AND content LIKE '%Cut short by a restart%'"
        ).fetchone()[0]
        report.pending_events = conn.execute("SELECT count(*) FROM event_journal WHERE state = 'pending'").fetchone()[0]
        report.pending_replies = conn.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()[0]
    finally:
        conn.close()


def _story(conn: sqlite3.Connection, user: str, slack: FakeSlack) -> list[str]:
    """How a user's messages went, to explain a wrong answer count: the order
    their messages were recorded in recall (by seq; a number out of place is
    one that overtook or was overtaken), which event's replies answered what,
    the posts they got (with the outbox id each carried), and their events'
    restart counts."""
    key = f"slack:{TEAM}:{user}"
    recorded = [
        (int(found.group(2)), event_id)
        for content, event_id in conn.execute(
            "SELECT m.content, m.event_id FROM messages m JOIN agents a ON a.id = m.agent_id"
            " WHERE a.key = ? AND m.role = 'user' AND m.name = 'user_message' ORDER BY m.seq",
            (key,),
        ).fetchall()
        if (found := MESSAGE.search(content or ""))
    ]
    order = " ".join(str(number) if number == n else f"[{number}]" for n, (number, _) in enumerate(recorded))
    lines = [f"  {user}'s messages in recall, in the order recorded ([n]: out of place): {order}"]
    answered_by = [
        f"{event_id}->{text!r}({state})"
        for event_id, text, state in conn.execute(
            "SELECT event_id, text, state FROM outbox WHERE agent_key = ? ORDER BY created_at", (key,)
        ).fetchall()
        if answered_in(text) != [(user, _number_of(event_id))]
    ]
    lines.append(f"  {user}'s replies that answer another message than their event's: {answered_by or 'none'}")
    posts = []
    for call in slack.calls_to("chat.postMessage"):
        if call.args.get("channel") == f"D{user}":
            metadata = call.args.get("metadata") or {}
            payload = (json.loads(metadata) if isinstance(metadata, str) else metadata).get("event_payload") or {}
            posts.append(f"{call.args.get('text')!r}<-{payload.get('outbox_id', '?')}")
    lines.append(f"  {user}'s posts in order (<- outbox id): {' '.join(posts)}")
    restarted = conn.execute(
        "SELECT event_id, attempts, state FROM event_journal WHERE agent_key = ? AND attempts > 0 ORDER BY n", (key,)
    ).fetchall()
    lines.append(f"  {user}'s events redone after a restart (attempts, state): {restarted or 'none'}")
    return lines


def _number_of(event_id: str) -> int:
    """The message number in a harness event id ("EvU3N0005": 5)."""
    found = re.search(r"N(\d+)$", event_id)
    return int(found.group(1)) if found else -1


def _is_default_human(text: str) -> bool:
    # The block's starting text (memory/working_context.py), before any fact.
    from memory.working_context import default_blocks

    human = next(block for block in default_blocks(2000, 2000) if block.label == "human")
    return text.strip() == human.value.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--messages", type=int, default=40, help="messages per user")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--startup-kills", type=int, default=0, help="how many of the kills land during start-up")
    parser.add_argument("--poison", metavar="USER:N", help="the bot dies whenever it works on this message (U2:3)")
    parser.add_argument("--hogs", type=int, default=0, help="processes spinning on the CPU meanwhile")
    parser.add_argument("--debounce", type=float, default=0.0, help="MEMGPT_DEBOUNCE_SECONDS (0: off)")
    parser.add_argument("--data-dir", type=Path, default=Path(f"/tmp/crash-harness-{uuid.uuid4().hex[:8]}"))
    args = parser.parse_args()
    poison = None
    if args.poison:
        user, _, number = args.poison.partition(":")
        poison = (user, int(number))
    report = asyncio.run(
        run(
            args.data_dir,
            kills=args.kills,
            users=args.users,
            per_user=args.messages,
            seed=args.seed,
            startup_kills=args.startup_kills,
            poison=poison,
            hogs=args.hogs,
            debounce=args.debounce,
        )
    )
    print(report.summary())
    for problem in report.problems[:40]:
        print("  -", problem)


if __name__ == "__main__":
    main()
