"""Test tool: a MongoDB wire-protocol server for the MongoDB tests.

With MONGODB_TEST_URI set, the tests run against that server (a real MongoDB:
every test gets its own database named memgpt_test_<session>_<n>, dropped when
the test ends; anything left with the session's prefix is dropped at exit).

Otherwise they run against FerretDB with its embedded SQLite handler, started
here on a free port in a temporary folder. Its binary is, in order:
$FERRETDB_BIN, the cached build ${MEMGPT_TOOLS_DIR:-~/.cache/memgpt-bot/bin}/
ferretdb-v1.24.2, or a fresh build by scripts/install_ferretdb.sh. If there is
no server to be had the MongoDB tests skip with the reason, or fail with it
when CI is set.

    python -m tests.mongo_server      # build if needed, start, print the URI, wait for Ctrl-C
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from memory.mongo.store import MongoStore
from tests.helpers import free_port, stop_process

FERRETDB_VERSION = "1.24.2"
ROOT = Path(__file__).resolve().parents[1]
INSTALL_SCRIPT = ROOT / "scripts" / "install_ferretdb.sh"
BUILD_TIMEOUT = 45 * 60  # a cold build on a busy 2-core machine is slow
START_TIMEOUT = 30.0


class ServerUnavailable(Exception):
    """No MongoDB-compatible server can be had; the text says why."""


def tools_dir() -> Path:
    configured = os.environ.get("MEMGPT_TOOLS_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "memgpt-bot" / "bin"


def find_or_build_ferretdb() -> Path:
    configured = os.environ.get("FERRETDB_BIN")
    if configured:
        if not os.access(configured, os.X_OK):
            raise ServerUnavailable(f"FERRETDB_BIN={configured} is not an executable file")
        return Path(configured)
    cached = tools_dir() / f"ferretdb-v{FERRETDB_VERSION}"
    if os.access(cached, os.X_OK):
        return cached
    env = {**os.environ, "FERRETDB_VERSION": FERRETDB_VERSION}
    # Past pytest's capture: the first run may build for minutes, say why.
    if sys.__stderr__ is not None:
        sys.__stderr__.write(
            f"\nbuilding FerretDB v{FERRETDB_VERSION} into {tools_dir()} for the MongoDB tests: once, about "
            "2 minutes (more on a busy machine), fetching Go modules from the Go module proxy\n"
        )
        sys.__stderr__.flush()
    try:
        done = subprocess.run(
            ["bash", str(INSTALL_SCRIPT)], env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerUnavailable(f"could not build FerretDB with {INSTALL_SCRIPT}: {exc}") from exc
    built = Path(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else cached
    if done.returncode != 0 or not os.access(built, os.X_OK):
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise ServerUnavailable(f"could not build FerretDB ({INSTALL_SCRIPT} exit {done.returncode}): {tail}")
    return built


def ping(uri: str, timeout: float = 1.0) -> bool:
    client: MongoClient[dict[str, object]] = MongoClient(uri, serverSelectionTimeoutMS=int(timeout * 1000))
    try:
        client.admin.command("ping")
        return True
    except PyMongoError:
        return False
    finally:
        client.close()


class FerretDB:
    """One FerretDB process on 127.0.0.1:<free port>, data in a temporary folder
    (its embedded SQLite handler), or in the PostgreSQL database at
    `postgresql_url` (its PostgreSQL handler: bench/postgres_server.py)."""

    def __init__(self, binary: Path, postgresql_url: str = "") -> None:
        self.binary = binary
        self.postgresql_url = postgresql_url
        self.folder = Path(tempfile.mkdtemp(prefix="memgpt-ferretdb-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.uri = ""

    def start(self) -> str:
        for _ in range(3):  # the free port may be taken between the probe and the start
            port = free_port()
            data = self.folder / f"data-{port}"
            data.mkdir()
            log = (self.folder / "ferretdb.log").open("ab")
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    *(
                        ("--handler=postgresql", f"--postgresql-url={self.postgresql_url}")
                        if self.postgresql_url
                        else ("--handler=sqlite", f"--sqlite-url=file:{data}/")
                    ),
                    f"--listen-addr=127.0.0.1:{port}",
                    f"--state-dir={self.folder}",
                    "--debug-addr=-",
                    "--telemetry=disable",
                    "--log-level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            self.uri = f"mongodb://127.0.0.1:{port}/"
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline and self.process.poll() is None:
                if ping(self.uri, timeout=0.5):
                    return self.uri
                time.sleep(0.1)
            self.stop(keep_folder=True)
        tail = (self.folder / "ferretdb.log").read_text(errors="replace").strip().splitlines()[-5:]
        self.stop()
        raise ServerUnavailable(f"FerretDB ({self.binary}) did not answer ping: {' | '.join(tail) or 'no output'}")

    def stop(self, keep_folder: bool = False) -> None:
        process, self.process = self.process, None
        stop_process(process)
        if not keep_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


class MongoTarget:
    """Where the MongoDB tests run: a URI, and fresh database names on it."""

    def __init__(self, uri: str, server: FerretDB | None) -> None:
        self.uri = uri
        self.server = server
        self.prefix = f"memgpt_test_{uuid.uuid4().hex[:8]}_"
        self._numbers = itertools.count(1)

    @property
    def is_ferretdb(self) -> bool:
        return self.server is not None

    def database_name(self) -> str:
        return f"{self.prefix}{next(self._numbers)}"

    def store(self, database: str | None = None, server_selection_timeout: float = 5.0) -> ScratchMongoStore:
        """A store on a fresh database (or on `database`), dropped when it closes."""
        name = database or self.database_name()
        return ScratchMongoStore(self.uri, name, server_selection_timeout=server_selection_timeout)

    def reopened(self, database: str) -> MongoStore:
        """A store on an existing `database` with a client of its own, as another
        bot process (or a restart) has; closing it leaves the data alone."""
        return MongoStore(self.uri, database, server_selection_timeout=5.0)

    def drop_leftovers(self) -> None:
        client: MongoClient[dict[str, object]] = MongoClient(self.uri, serverSelectionTimeoutMS=5000)
        try:
            for name in client.list_database_names():
                if name.startswith(self.prefix):
                    client.drop_database(name)
        except PyMongoError:
            pass
        finally:
            client.close()

    def close(self) -> None:
        if self.server is None:
            self.drop_leftovers()  # FerretDB's folder goes whole
        else:
            self.server.stop()


class ScratchMongoStore(MongoStore):
    """A MongoStore on a throwaway database, dropped when the store closes."""

    async def close(self) -> None:
        client = self._client
        if client is not None:
            try:
                await client.drop_database(self.database)
            except Exception:  # best effort: leftovers go when the target closes
                pass
        await super().close()


_shared: MongoTarget | None = None
_failure: str | None = None


def start_target() -> MongoTarget:
    uri = os.environ.get("MONGODB_TEST_URI")
    if uri:
        return MongoTarget(uri, None)
    server = FerretDB(find_or_build_ferretdb())
    return MongoTarget(server.start(), server)


def shared_target() -> MongoTarget:
    """The session's target, started on first use; skips the calling test (or
    fails it, when CI is set) with the reason if there is none."""
    global _shared, _failure
    if _shared is None and _failure is None:
        try:
            _shared = start_target()
        except ServerUnavailable as exc:
            _failure = f"no MongoDB server for the MongoDB tests: {exc}"
    if _shared is None:
        reason = _failure or "no MongoDB server"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return _shared


def close_shared() -> None:
    global _shared
    target, _shared = _shared, None
    if target is not None:
        target.close()


atexit.register(close_shared)


@pytest.fixture(scope="session")
def mongo_target() -> Iterator[MongoTarget]:
    yield shared_target()
    close_shared()


@pytest.fixture
async def mongo_store(mongo_target: MongoTarget) -> AsyncIterator[MongoStore]:
    """An open store on a database of its own, dropped when the test ends."""
    store = mongo_target.store()
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def mongo_twin(mongo_store: MongoStore, mongo_target: MongoTarget) -> AsyncIterator[MongoStore]:
    """A second open store on mongo_store's database: another bot process."""
    twin = mongo_target.reopened(mongo_store.database)
    await twin.open()
    try:
        yield twin
    finally:
        await twin.close()


if __name__ == "__main__":
    target = start_target()
    print(target.uri, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        target.close()
