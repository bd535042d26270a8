"""One fork server for every test that starts the bot or its CLI as a process.

Importing the bot costs about 2 s of CPU and importing sentence-transformers
(torch) about 10 s more; on a busy 2-core machine that is most of a CLI
test's time, and the suite starts the CLI some sixty times and the bot a
hundred times (tests/crash_harness.py). So the modules are imported once, in
a fork server, and each run forks from it: still a real new process (its own
memory, file descriptors, exit code, event loop), without the imports.
Nothing runs in the server but imports and tests/fork_preload.py (token
encoders, then gc.freeze()): no thread, model or connection exists there to be
inherited in a broken state (torch's thread pools start on first use, in the child).

There is one fork server per test process, so its preload list lives here and
nowhere else.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(
    [
        "cli.main",
        "cli.app",
        "bot.runtime",
        "bot.checkins.scheduler",  # APScheduler: about 20 ms of CPU per bot start
        "memory.sqlite.store",
        "dotenv",
        "adapters.slack",
        "adapters.discord",
        "memory.embeddings",
        "sentence_transformers",
        "tests.fork_preload",  # last: encoders, then the heap frozen
    ]
)


def _run_cli(argv: list[str], env: dict[str, str], cwd: str, stdin: str, stdout: str, stderr: str) -> None:
    """In the forked child: the CLI as `python -m cli.main ARGV` would run it."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path, mode in ((0, stdin, os.O_RDONLY), (1, stdout, os.O_WRONLY), (2, stderr, os.O_WRONLY)):
        opened = os.open(path, mode)
        os.dup2(opened, fd)
        os.close(opened)
    # multiprocessing points a child's sys.stdin at /dev/null: give the CLI its
    # real standard streams, as a fresh interpreter would have them.
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)
    sys.argv = ["memgpt-bot", *argv]
    from cli.main import main

    main(argv)  # raises SystemExit with the exit code, which becomes the process's


def run_cli(
    argv: Sequence[str], *, env: dict[str, str], cwd: Path, stdin: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`memgpt-bot ARGV` in a process forked from the server, with `stdin` as
    its standard input (None: empty); returns what subprocess.run would."""
    with tempfile.TemporaryDirectory(prefix="memgpt-cli-") as folder:
        paths = {name: Path(folder) / name for name in ("stdin", "stdout", "stderr")}
        paths["stdin"].write_text(stdin or "", encoding="utf-8")
        for name in ("stdout", "stderr"):
            paths[name].touch()
        process = FORKS.Process(
            target=_run_cli, args=(list(argv), env, str(cwd), *(str(paths[n]) for n in ("stdin", "stdout", "stderr")))
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["memgpt-bot", *argv], timeout)
        return subprocess.CompletedProcess(
            ["memgpt-bot", *argv],
            process.exitcode,
            paths["stdout"].read_text(encoding="utf-8"),
            paths["stderr"].read_text(encoding="utf-8"),
        )


class RunningCLI:
    """`memgpt-bot ARGV` running in a process forked from the server, its
    standard streams in files under `folder` (stdin empty)."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str], cwd: Path, folder: Path) -> None:
        self.argv = list(argv)
        self.paths = {name: folder / name for name in ("stdin", "stdout", "stderr")}
        for path in self.paths.values():
            path.write_text("", encoding="utf-8")
        streams = (str(self.paths[name]) for name in ("stdin", "stdout", "stderr"))
        self.process = FORKS.Process(target=_run_cli, args=(self.argv, env, str(cwd), *streams))
        self.process.start()

    @property
    def stderr(self) -> str:
        return self.paths["stderr"].read_text(encoding="utf-8")

    def signal(self, signum: int) -> None:
        if self.process.pid is not None and self.process.exitcode is None:
            os.kill(self.process.pid, signum)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if it still runs after `timeout` seconds."""
        self.process.join(timeout)
        return self.process.exitcode

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()


def start_process(target: Callable[..., Any], *args: Any) -> multiprocessing.process.BaseProcess:
    """A daemon process forked from the server running `target(*args)`."""
    process = FORKS.Process(target=target, args=args, daemon=True)
    process.start()
    return process
