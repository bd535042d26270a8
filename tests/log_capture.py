"""Every log record of a test session in one file, for the secrets scan.

With MEMGPT_LOG_SCAN_FILE set, tests/conftest.py routes every record of the
session (root logger, DEBUG: third-party debug output is where an
Authorization header would show) to that file, and at the end appends the log
files that subprocesses wrote under the session's temporary folder (the CLI's
`<data dir>/memgpt-bot.log`). `scripts/scan_logs_for_secrets.py FILE` then
fails if any value of tests/secrets_catalog.py is in it.

Test tool only, never part of the product.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "MEMGPT_LOG_SCAN_FILE"
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"
# Log files written by subprocesses (the CLI) under the session's temporary folder.
SUBPROCESS_LOGS = "*.log"


class SessionLogCapture:
    def __init__(self, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Appends: a CI run that calls pytest more than once keeps every session.
        self.target = target
        self.handler = logging.FileHandler(target, mode="a", encoding="utf-8")
        self.handler.setLevel(logging.DEBUG)
        self.handler.setFormatter(logging.Formatter(FORMAT))
        self._previous_level = logging.WARNING

    def start(self) -> None:
        root = logging.getLogger()
        self._previous_level = root.level
        root.addHandler(self.handler)
        self.keep_debug()

    def keep_debug(self) -> None:
        """Records below the root level are never created; code under test
        (the CLI run in-process) may have raised it since."""
        logging.getLogger().setLevel(logging.DEBUG)

    def stop(self, subprocess_logs: Path | None = None) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self._previous_level)
        if subprocess_logs is not None and subprocess_logs.is_dir():
            stream = self.handler.stream
            for path in sorted(subprocess_logs.rglob(SUBPROCESS_LOGS)):
                if path.is_file() and path.resolve() != self.target.resolve():
                    stream.write(f"==> {path} <==\n")
                    stream.write(path.read_text(encoding="utf-8", errors="replace"))
                    stream.write("\n")
        self.handler.close()


def capture_file(target: str) -> Path:
    """Where this test process writes the capture named `target`: each
    pytest-xdist worker keeps its own file beside it (NAME-gw0.log, ...)."""
    path = Path(target).expanduser().resolve()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return path.with_name(f"{path.stem}-{worker}{path.suffix}") if worker else path


@contextmanager
def session_log_capture(target: str | None, subprocess_logs: Path | None) -> Iterator[SessionLogCapture | None]:
    """Capture into `target` (None or empty: do nothing) for the `with` body."""
    if not target:
        yield None
        return
    capture = SessionLogCapture(capture_file(target))
    capture.start()
    try:
        yield capture
    finally:
        capture.stop(subprocess_logs)
