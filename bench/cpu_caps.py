"""A CPU quota per process, through Linux control groups, for benchmarks that
stand in for several machines on one.

Several bot processes on one 2-core machine share its cores with the database
and the LLM server, so the second process mostly takes CPU from the first: the
figure then says how many cores the machine has, not whether the processes
scale. Each process put in a `CpuCaps` group gets a quota of its own (say 0.15
of a core), as if it ran on a small machine of its own, and the database keeps
the rest. Then N capped processes can run N times as fast as one as long as
the database keeps up, which is the question a scale-out asks.

Needs root and a mounted CPU controller: cgroup v2 (cpu.max) or v1
(cpu.cfs_quota_us). `CpuCaps.unavailable()` says why not, when not.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def _controller_root() -> tuple[Path, int] | None:
    """Where CPU groups are made, and the cgroup version; None if nowhere."""
    controllers = CGROUP_V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return CGROUP_V2, 2
    if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        return CGROUP_V1_CPU, 1
    return None


class CpuCaps:
    """One control group per capped process, each with `cores` of CPU time;
    removed again by close() (a group can only go once its processes have)."""

    def __init__(self, cores: float, label: str = "memgpt-bench") -> None:
        found = _controller_root()
        if found is None:
            raise RuntimeError(self.unavailable() or "no CPU controller")
        self.root, self.version = found
        self.cores = cores
        self.label = f"{label}-{os.getpid()}"
        self.groups: list[Path] = []

    @staticmethod
    def unavailable() -> str | None:
        """Why processes can't be capped here, or None if they can."""
        if _controller_root() is None:
            return "no cgroup CPU controller is mounted (cgroup v2 cpu.max or v1 cpu.cfs_quota_us)"
        if os.geteuid() != 0:
            return "capping a process's CPU needs root (it writes to /sys/fs/cgroup)"
        return None

    def cap(self, pid: int) -> None:
        """Give process `pid` (all its threads, and children it starts later)
        a group of its own with the quota."""
        group = self.root / f"{self.label}-{len(self.groups)}"
        if self.version == 2:
            with contextlib.suppress(OSError):  # already on, or set by whoever made the parent
                (self.root / "cgroup.subtree_control").write_text("+cpu")
        group.mkdir()
        self.groups.append(group)
        quota = max(int(self.cores * PERIOD_US), 1_000)
        if self.version == 2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))

    def throttled_seconds(self) -> float:
        """How long, in all, the capped processes were held back by their quota:
        a capped process that was never throttled was not limited by its cap."""
        total = 0.0
        for group in self.groups:
            with contextlib.suppress(OSError):
                for line in (group / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "throttled_usec":
                        total += int(value) / 1e6
                    elif key == "throttled_time":  # v1, in nanoseconds
                        total += int(value) / 1e9
        return total

    def close(self) -> None:
        for group in self.groups:
            with contextlib.suppress(OSError):
                group.rmdir()
        self.groups.clear()
