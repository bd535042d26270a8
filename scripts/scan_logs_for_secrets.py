#!/usr/bin/env python3
"""Fail if any known fake secret of the test suite appears in log files.

    scripts/scan_logs_for_secrets.py [--glob PATTERN] [--secret LABEL=VALUE ...] PATH...

Each PATH is a file, or a folder whose files matching --glob (default
`*.log`) are scanned. The secrets are those of tests/secrets_catalog.py, each
looked for as is and percent-encoded (as it would sit in a URL), plus any
given with --secret. A hit prints `PATH:LINE: LABEL`, never the value.

Exit status: 0 clean, 1 a secret was found, 2 a PATH does not exist or no
file was scanned (a capture that never ran must not pass for a clean one).

CI: run the tests with MEMGPT_LOG_SCAN_FILE=FILE (tests/log_capture.py),
then this script on FILE.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]


def catalog() -> dict[str, str]:
    sys.path.insert(0, str(ROOT))  # tests/ is a package of the checkout, not an installed one
    from tests.secrets_catalog import SECRETS

    return dict(SECRETS)


def forms(secrets: dict[str, str]) -> list[tuple[str, bytes]]:
    """(label, byte pattern) for every way a value may be written out."""
    patterns: list[tuple[str, bytes]] = []
    for label, value in secrets.items():
        for form in dict.fromkeys((value, quote(value, safe=""))):
            patterns.append((label, form.encode()))
    return patterns


def files(paths: Iterable[Path], pattern: str) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob(pattern) if p.is_file())
        else:
            yield path


def scan(path: Path, patterns: list[tuple[str, bytes]]) -> Iterator[tuple[int, str]]:
    """(line number, label) of every hit; lines are read as bytes, so any encoding is fine."""
    with path.open("rb") as stream:
        for number, line in enumerate(stream, 1):
            for label in dict.fromkeys(label for label, form in patterns if form in line):
                yield number, label


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    parser.add_argument("--glob", default="*.log", help="files to scan inside a folder (default: *.log)")
    parser.add_argument(
        "--secret", action="append", default=[], metavar="LABEL=VALUE", help="one more secret to look for (repeatable)"
    )
    args = parser.parse_args(argv)

    secrets = catalog()
    for item in args.secret:
        label, sep, value = item.partition("=")
        if not sep or not value:
            parser.error(f"--secret takes LABEL=VALUE, got {item!r}")
        secrets[label] = value
    missing = [str(path) for path in args.paths if not path.exists()]
    if missing:
        print(f"scan_logs_for_secrets: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    patterns = forms(secrets)
    scanned = hits = 0
    for path in files(args.paths, args.glob):
        scanned += 1
        for number, label in scan(path, patterns):
            hits += 1
            print(f"{path}:{number}: {label}")
    if not scanned:
        print("scan_logs_for_secrets: no file to scan", file=sys.stderr)
        return 2
    verdict = f"{hits} secret(s) found" if hits else "no secret found"
    print(f"scan_logs_for_secrets: {verdict} in {scanned} file(s), {len(secrets)} secrets looked for", file=sys.stderr)
    return 1 if hits else 0


if __name__ == "__main__":
    raise SystemExit(main())
