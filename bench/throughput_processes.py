"""Events per second with 1, 2 and 3 bot processes on one MongoDB, and one
process on SQLite, with an instant model and 1,000 users.

Every bot process is a real `Runtime` (leases, inbox, limits, usage, recall)
in its own OS process; the users are split between the processes as the
leases would settle them (user i on process i mod N), and each process sends
its users' events with the same concurrency. The scripted LLM server runs in
its own process; MongoDB is FerretDB (tests/mongo_server.py) unless
MONGODB_URI names a server. Baselines in the same run: the bare openai
client's rate against the same server (on its default httpx transport and on
the aiohttp one the bot uses: the ceiling for one process; the sqlite row shows
both ratios), and one
process's rate for the N-process runs, so the figures read as ratios on a
shared, noisy machine. The CPU seconds each part used per event (bot
processes, the database, the LLM server) say which one is the bottleneck.

On a 2-core machine a second bot process mostly takes CPU from the first and
from the database. `--cpu-per-process 0.15` gives each bot process a quota of
its own (bench/cpu_caps.py, needs root), as if each ran on a small machine of
its own beside an uncapped database: then the ratio to one process says
whether the processes scale, and the database's cores in use say where it
becomes the bottleneck.

    python bench/throughput_processes.py [--users 1000] [--events 1000] [--processes 1,2,3] [--concurrency 32]
                                         [--cpu-per-process CORES] [--ferretdb-on sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import queue
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.cpu_caps import CpuCaps
from bench.throughput import bare_rate, serve

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    name: str
    processes: int
    events: int
    seconds: float
    bot_cpu: float
    db_cpu: float
    llm_cpu: float
    throttled: float = 0.0  # seconds the bot processes were held back by their CPU quota

    @property
    def db_cores(self) -> float:
        """Cores the database kept busy during the run."""
        return self.db_cpu / self.seconds

    @property
    def rate(self) -> float:
        return self.events / self.seconds


def name_and_cpu(stat: Path) -> tuple[str, float]:
    """A process's name and its user + system CPU seconds, with its waited-for
    children's, so far, from its /proc/<pid>/stat ("", 0.0 once it is gone)."""
    try:
        text = stat.read_text()
    except OSError:
        return "", 0.0
    name, fields = text[text.find("(") + 1 : text.rfind(")")], text[text.rfind(")") + 1 :].split()
    return name, sum(int(value) for value in fields[11:15]) / TICKS


def cpu_seconds(pid: int) -> float:
    return name_and_cpu(Path(f"/proc/{pid}/stat"))[1]


DATABASE_PROCESSES = ("ferretdb", "postgres", "mongod")


def database_cpu() -> float:
    """CPU seconds so far of every database process on this machine (by name):
    FerretDB, PostgreSQL's server and backends under it, or a mongod."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        name, cpu = name_and_cpu(stat)
        if name.startswith(DATABASE_PROCESSES):
            total += cpu
    return total


def bot_process(
    index: int, count: int, store: dict[str, str], base_url: str, args: dict[str, int], ready: Any, go: Any, out: Any
) -> None:
    asyncio.run(_bot(index, count, store, base_url, args, ready, go, out))


async def _bot(
    index: int, count: int, store: dict[str, str], base_url: str, args: dict[str, int], ready: Any, go: Any, out: Any
) -> None:
    from bot.config import Settings
    from bot.events import UserMessage
    from bot.llm import LLMClient
    from bot.runtime import Runtime
    from cli.common import freeze_start_up_heap
    from memory.embeddings import Embedder

    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            openai_api_key="bench",
            model="bench-model",
            context_window=8_192,
            data_dir=Path(store.get("sqlite_dir") or data_dir),
            llm_max_retries=0,
            rate_limit_per_minute=10**9,  # checked and counted on every event, never holding one back
            daily_token_budget=10**15,
            mongodb_uri=store.get("uri", ""),
            mongodb_db=store.get("db", "memgpt"),
        )
        llm = LLMClient(settings.model, api_key="bench", base_url=base_url, max_retries=0)
        runtime = await Runtime.create(settings, llm=llm, embedder=Embedder())
        freeze_start_up_heap()  # as `memgpt-bot run` does (cli/common.py)
        users = [user for user in range(args["users"]) if user % count == index]
        semaphore = asyncio.Semaphore(args["concurrency"])

        async def one(i: int, user: int) -> None:
            async with semaphore:
                await runtime.handle(UserMessage(platform="slack", user_id=f"T1:U{user}", text=f"message {i}"))

        await asyncio.gather(*(one(i, user) for i, user in enumerate(users)))  # every agent exists, with history
        ready.put(index)
        go.wait()
        rng = random.Random(index)
        started = time.perf_counter()
        cpu = time.process_time()
        await asyncio.gather(*(one(i, rng.choice(users)) for i in range(args["events"])))
        out.put((index, started, time.perf_counter(), time.process_time() - cpu))
        await runtime.close()


def run_processes(
    name: str,
    count: int,
    store: dict[str, str],
    base_url: str,
    args: dict[str, int],
    llm_pid: int,
    cores: float | None = None,
) -> Run | None:
    """One run of `count` bot processes, each capped at `cores` of CPU if
    given; None (said why) if a phase outlived --timeout."""
    context = multiprocessing.get_context("spawn")
    ready, out, go = context.Queue(), context.Queue(), context.Event()
    bots = [
        context.Process(target=bot_process, args=(i, count, store, base_url, args, ready, go, out), daemon=True)
        for i in range(count)
    ]
    caps = CpuCaps(cores) if cores else None
    for process in bots:
        process.start()
        if caps is not None and process.pid is not None:
            caps.cap(process.pid)
    try:
        for _ in bots:
            ready.get(timeout=args["timeout"])
        db_before, llm_before = database_cpu(), cpu_seconds(llm_pid)
        throttled_before = caps.throttled_seconds() if caps else 0.0
        go.set()
        results = [out.get(timeout=args["timeout"]) for _ in bots]
        throttled = caps.throttled_seconds() - throttled_before if caps else 0.0
    except queue.Empty:
        print(f"{name}: a phase took over {args['timeout']} s (warm-up or run); stopped", flush=True)
        return None
    finally:
        for process in bots:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        if caps is not None:
            caps.close()
    db_cpu, llm_cpu = database_cpu() - db_before, cpu_seconds(llm_pid) - llm_before
    start, end = min(r[1] for r in results), max(r[2] for r in results)
    bot_cpu = sum(r[3] for r in results)
    run = Run(name, count, args["events"] * count, end - start, bot_cpu, db_cpu, llm_cpu, throttled)
    print(f"{name}: {run.events} events in {run.seconds:.1f} s", flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--events", type=int, default=1_000, help="events per bot process")
    parser.add_argument("--processes", default="1,2,3", help="bot process counts to run on MongoDB")
    parser.add_argument("--concurrency", type=int, default=32, help="events in flight per process")
    parser.add_argument("--timeout", type=int, default=300, help="seconds any one phase may take")
    parser.add_argument("--no-sqlite", action="store_true", help="skip the one-process SQLite run")
    parser.add_argument(
        "--ferretdb-on",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="FerretDB's storage: its embedded SQLite (as the tests) or a throwaway PostgreSQL cluster",
    )
    parser.add_argument(
        "--cpu-per-process",
        type=float,
        default=None,
        metavar="CORES",
        help="cap each MongoDB bot process at this much of a core (as if on a machine of its own; needs root)",
    )
    options = parser.parse_args()
    if options.cpu_per_process is not None and (why := CpuCaps.unavailable()) is not None:
        parser.error(f"--cpu-per-process: {why}")
    args = {k: getattr(options, k) for k in ("users", "events", "concurrency", "timeout")}

    context = multiprocessing.get_context("spawn")
    port_queue, stop = context.Queue(), context.Event()
    llm = context.Process(target=serve, args=(port_queue, stop), daemon=True)
    llm.start()
    base_url = port_queue.get(timeout=30)
    assert llm.pid is not None

    runs: list[Run | None] = []
    requested = [int(n) for n in options.processes.split(",") if n.strip()]
    baseline, _ = asyncio.run(bare_rate(base_url, 3_000, options.concurrency))
    same_transport, _ = asyncio.run(bare_rate(base_url, 3_000, options.concurrency, aiohttp=True))
    if not options.no_sqlite:
        with tempfile.TemporaryDirectory() as folder:
            runs.append(run_processes("sqlite", 1, {"sqlite_dir": folder}, base_url, args, llm.pid))
        print(f"bare openai client: {baseline:.0f} requests/s ({same_transport:.0f} on aiohttp)", flush=True)

    server, postgres = None, None
    uri = os.environ.get("MONGODB_URI", "")
    if not uri and requested:
        from tests.mongo_server import FerretDB, find_or_build_ferretdb

        postgresql_url = ""
        if options.ferretdb_on == "postgresql":
            from bench.postgres_server import PostgreSQL

            postgres = PostgreSQL()
            postgresql_url = postgres.start()
        server = FerretDB(find_or_build_ferretdb(), postgresql_url)
        uri = server.start()
    try:
        for count in requested:
            store = {"uri": uri, "db": f"bench_throughput_{uuid.uuid4().hex[:8]}"}
            name = f"mongodb x{count}"
            runs.append(run_processes(name, count, store, base_url, args, llm.pid, options.cpu_per_process))
    finally:
        if server is not None:
            server.stop()
        if postgres is not None:
            postgres.stop()
        stop.set()
        llm.join(timeout=10)

    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, load {load}")
    print(
        f"{options.users} users, {options.events} events per process, concurrency {options.concurrency} per "
        f"process, instant LLM in its own process; MongoDB: "
        f"{f'FerretDB on {options.ferretdb_on}' if server else uri or 'none'}"
    )
    if options.cpu_per_process:
        print(
            f"each MongoDB bot process capped at {options.cpu_per_process:.2f} of a core (a machine of its own); "
            "the database and the LLM server uncapped"
        )
    print(
        f"bare openai client: {baseline:.0f} requests/s on its default httpx transport, {same_transport:.0f} on "
        "the SDK's aiohttp transport the bot uses (one process)"
    )
    finished = [run for run in runs if run is not None]
    one = next((run for run in finished if run.name == "mongodb x1"), None)
    print(
        f"{'run':<14}{'events/s':>9}{'ratio':>26}{'CPU ms/event: bots':>20}{'db':>9}{'llm':>7}"
        f"{'db cores':>10}{'bots throttled':>16}"
    )
    for run in finished:
        if run.name == "sqlite":
            ratio = f"{run.rate / baseline:.2f} / {run.rate / same_transport:.2f} of bare"
        elif one is not None:
            ratio = f"{run.rate / one.rate:.2f} of x1"
            if run.processes > 1:
                added = (run.rate - one.rate) / (run.processes - 1) / one.rate
                ratio = f"{run.rate / one.rate:.2f} of x1, +{added:.2f}/proc"
        else:
            ratio = ""
        per_event = 1000 / run.events
        print(
            f"{run.name:<14}{run.rate:>9.1f}{ratio:>26}{run.bot_cpu * per_event:>20.2f}"
            f"{run.db_cpu * per_event:>9.2f}{run.llm_cpu * per_event:>7.2f}"
            f"{run.db_cores:>10.2f}{run.throttled / max(run.seconds * run.processes, 1e-9):>15.0%}"
        )
    for count in requested:
        if not any(run.processes == count and run.name.startswith("mongodb") for run in finished):
            print(f"mongodb x{count}: did not finish within --timeout {options.timeout} s")
    print_bottleneck(finished, os.cpu_count() or 1)
    print("goals: sqlite >= 500 events/s (quiet machine), >= 0.8 of the bare client; each added process >= 0.7 of x1")


def print_bottleneck(runs: list[Run], cpus: int) -> None:
    """Where the database becomes the bottleneck: the rate at which it would
    keep every core of this machine busy, from its CPU per event."""
    mongo = [run for run in runs if run.name.startswith("mongodb") and run.events]
    if not mongo:
        return
    per_event = sum(run.db_cpu for run in mongo) / sum(run.events for run in mongo)
    one = next((run for run in mongo if run.processes == 1), None)
    line = (
        f"the database: {per_event * 1000:.1f} CPU ms per event, so one core of it serves at most "
        f"{1 / per_event:.0f} events/s and this machine's {cpus} at most {cpus / per_event:.0f}"
    )
    if one is not None:
        line += f" (the rate of {cpus / per_event / one.rate:.1f} processes like x1, were nothing else running)"
    print(line)


if __name__ == "__main__":
    main()
