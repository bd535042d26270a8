"""A throwaway PostgreSQL cluster for benchmarks: FerretDB's PostgreSQL
handler on it is a MongoDB whose writes do not all queue for one SQLite file
(FerretDB's embedded handler, which the tests use, serializes every write).

Needs PostgreSQL's server binaries (initdb, pg_ctl; Debian's postgresql
package puts them in /usr/lib/postgresql/<version>/bin). PostgreSQL refuses to
run as root, so as root the cluster belongs to the `postgres` user and its
commands run through runuser.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.helpers import free_port


def postgres_bin() -> Path:
    """The folder of initdb and pg_ctl: on PATH, or Debian's versioned folder."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent  # a link into the versioned folder, beside createdb
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not versions:
        raise SystemExit("PostgreSQL's initdb was not found (Debian: apt-get install postgresql)")
    return Path(versions[-1]).parent


class PostgreSQL:
    """One cluster on 127.0.0.1:<free port>, its files in a temporary folder,
    with fsync and synchronous commits on (PostgreSQL's defaults, as deployed)."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.folder = Path(tempfile.mkdtemp(prefix="memgpt-postgres-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *command: str) -> None:
        done = subprocess.run([*self.as_user, *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            self.stop()
            raise SystemExit(f"PostgreSQL: {Path(command[0]).name} failed ({done.returncode}): {done.stderr[-500:]}")

    def start(self, database: str = "ferretdb") -> str:
        """The cluster runs and holds `database`; its postgres:// URL."""
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"), "-w", "start"
        )
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", database)
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            stop = [*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
            subprocess.run(stop, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.folder, ignore_errors=True)
