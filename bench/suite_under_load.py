"""The README's test command from a fresh clone, with CPU hogs beside it, several runs
in a row (issue 39: "at most 8 minutes on a 2-core machine with two CPU hogs beside it,
5 runs in a row").

Each run clones the repository's HEAD afresh (`git clone --local`), runs the README's
test command in the clone exactly as written there (it makes its own virtual
environment), and times it from start to exit; the hogs are busy Python loops
started before the first run and stopped after the last. A quiet run first (no hogs)
is the baseline, so the figures read as a ratio on a machine whose other load varies.

    python bench/suite_under_load.py                 # a quiet run, then 5 with 2 hogs
    python bench/suite_under_load.py --runs 1 --no-baseline
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 8 * 60
_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed).*) in [\d.]+s", re.MULTILINE)


def readme_test_command() -> str:
    """The line under the README's "# Run the tests" comment: the one command CI runs too."""
    lines = (ROOT / "README.md").read_text().splitlines()
    for index, line in enumerate(lines):
        if line.startswith("# Run the tests"):
            return lines[index + 1].strip()
    raise SystemExit("README.md has no '# Run the tests' command")


def machine() -> str:
    load = ", ".join(f"{figure:.2f}" for figure in os.getloadavg())
    return f"{platform.machine()} {os.cpu_count()} cpus, load average {load}, Python {platform.python_version()}"


@contextlib.contextmanager
def hogs(count: int) -> Iterator[None]:
    """`count` processes that each keep one core busy until the block ends."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in busy:
            process.kill()
            process.wait()


def one_run(command: str, label: str) -> tuple[float, str, int]:
    """Seconds, pytest's summary line and the exit code of the command in a fresh clone."""
    with tempfile.TemporaryDirectory(prefix="suite-run-") as scratch:
        clone = Path(scratch) / "repo"
        subprocess.run(["git", "clone", "-q", "--local", str(ROOT), str(clone)], check=True)
        log = Path(scratch) / "out.log"
        started = time.monotonic()
        with log.open("w") as out:
            code = subprocess.run(["bash", "-c", command], cwd=clone, stdout=out, stderr=subprocess.STDOUT).returncode
        seconds = time.monotonic() - started
        text = log.read_text(errors="replace")
        found = _SUMMARY.findall(text)
        summary = found[-1][0] if found else text.strip().splitlines()[-1][-120:] if text.strip() else "(no output)"
        print(f"{label:>10}  {seconds / 60:5.2f} min  exit {code}  {summary}", flush=True)
        if code:  # which tests, and why: the run's log goes with its scratch folder
            for line in text.splitlines():
                if line.startswith(("FAILED ", "ERROR ")) or line.startswith("E   "):
                    print(f"{'':>12}{line[:300]}", flush=True)
        return seconds, summary, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs with the hogs beside (default 5)")
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside the suite (default 2)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the quiet run first")
    args = parser.parse_args()

    command = readme_test_command()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"machine: {machine()}\ncommit: {head.strip()}\ncommand: {command}", flush=True)
    quiet = None if args.no_baseline else one_run(command, "quiet")[0]
    with hogs(args.hogs):
        runs = [one_run(command, f"{args.hogs} hogs #{n + 1}") for n in range(args.runs)]
    times = [seconds for seconds, _, _ in runs]
    failed = sum(code != 0 for _, _, code in runs)
    print(
        f"with {args.hogs} hogs: max {max(times) / 60:.2f} min, mean {sum(times) / len(times) / 60:.2f} min "
        f"(budget {BUDGET_S / 60:.0f} min), {failed} of {len(runs)} runs failed"
        + (f"; max against the quiet run x{max(times) / quiet:.2f}" if quiet else "")
    )
    print(f"machine after: {machine()}")
    return 0 if not failed and max(times) <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
