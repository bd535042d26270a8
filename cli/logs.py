"""Logging for every command: standard output stays clean for results.

Standard error gets our own warnings (everything with -v), one line each; the
data folder's log file gets INFO (or MEMGPT_LOG_LEVEL) in a readable line per
record, and is rotated by size (MEMGPT_LOG_MAX_BYTES, MEMGPT_LOG_BACKUPS) so it
never grows without bound. Libraries' chatter (every HTTP request, optional
voice support, model-loading progress) is held to warnings.
"""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

from bot.config import Settings
from cli.common import PROG, CLIError

LOG_FILE = "memgpt-bot.log"
# Loggers that say something on every request or at every start that no
# operator needs: at WARNING unless MEMGPT_LOG_LEVEL=DEBUG.
# The openai client logs every request through httpx2 (its fork of httpx) and httpcore2.
NOISY_LIBRARIES = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "openai",
    "discord",
    "slack_bolt",
    "slack_sdk",
    "urllib3",
    "pymongo",
)
# At DEBUG the platform libraries log whole payloads: what people write, which forgetting
# (bot/forgetting/) cannot reach in a log file. Said at every start at that level.
DEBUG_KEEPS_WORDS = (
    "MEMGPT_LOG_LEVEL=DEBUG: {path} keeps what people write (the chat libraries log whole payloads), "
    "and forgetting does not reach it; use DEBUG only to diagnose, then delete the log"
)
# Said once at every start, about features the bot does not use (voice).
UNUSED_FEATURE_NOTES = ("PyNaCl is not installed", "davey is not installed")


class ConsoleFormatter(logging.Formatter):
    """One line per record, never a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{PROG}: {record.levelname.lower()}: {' '.join(record.getMessage().split())}"


def not_file_only(record: logging.LogRecord) -> bool:
    return not getattr(record, "file_only", False)


def not_tokenizer_note(record: logging.LogRecord) -> bool:
    # Memory commands count no tokens: a tokenizer fallback is no news to their user.
    return not (record.name == "memory.tokens" and record.levelno < logging.ERROR)


def not_unused_feature_note(record: logging.LogRecord) -> bool:
    return not any(note in record.getMessage() for note in UNUSED_FEATURE_NOTES)


_handlers: list[logging.Handler] = []


def configure_logging(settings: Settings, *, verbose: bool, counts_tokens: bool = True) -> Path:
    """Root logging, once per run() (the handlers of an earlier call are replaced)."""
    root = logging.getLogger()
    for handler in _handlers:
        root.removeHandler(handler)
        handler.close()
    _handlers.clear()

    console = logging.StreamHandler()  # standard error
    console.setLevel(logging.INFO if verbose else logging.WARNING)
    console.setFormatter(ConsoleFormatter())
    console.addFilter(not_file_only)
    console.addFilter(not_unused_feature_note)
    if not counts_tokens:
        console.addFilter(not_tokenizer_note)
    _handlers.append(console)

    data_dir = Path(settings.data_dir)
    path = data_dir / LOG_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        file_handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=settings.log_max_bytes, backupCount=settings.log_backups, encoding="utf-8"
        )
    except OSError as error:
        raise CLIError(f"cannot write to the data folder {data_dir}: {error.strerror or error}") from None
    file_level = logging.getLevelNamesMapping()[settings.log_level]
    file_handler.setLevel(file_level)
    file_handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    )
    file_handler.addFilter(not_unused_feature_note)
    _handlers.append(file_handler)

    for handler in _handlers:
        root.addHandler(handler)
    root.setLevel(min(console.level, file_level))
    library_level = logging.DEBUG if file_level <= logging.DEBUG else logging.WARNING
    for name in NOISY_LIBRARIES:
        logging.getLogger(name).setLevel(library_level)
    # sentence-transformers shows progress bars whenever its logger is at INFO.
    logging.getLogger("sentence_transformers").setLevel(logging.INFO if verbose else logging.WARNING)
    logging.captureWarnings(True)
    if file_level <= logging.DEBUG:
        logging.getLogger(__name__).warning(DEBUG_KEEPS_WORDS.format(path=path))
    return path
