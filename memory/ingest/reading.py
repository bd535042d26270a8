"""What the loader reads: the files to load, each streamed as passages a
batch at a time (in worker threads; memory/ingest/documents.py says how each
format streams), with the content key that makes re-loading cheap."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Literal

from memory.ingest.chunking import Chunk, iter_chunks
from memory.ingest.documents import ScannedFile, document_kind, iter_markdown_sections, scan_file, stream_sections
from memory.places import DM_KEY
from memory.tokens import TokenCounter
from memory.types import Passage

Status = Literal["loaded", "unchanged", "failed"]


@dataclass(slots=True)
class FileResult:
    name: str
    status: Status
    passages_added: int = 0
    passages_existing: int = 0  # already stored (this file loaded before, or the same text elsewhere)
    reason: str = ""

    @property
    def passages(self) -> int:
        return self.passages_added + self.passages_existing


def passage_hash(text: str) -> str:
    """Content key of a passage: whitespace differences do not make it new."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


# -- what to load --------------------------------------------------------------
@dataclass(slots=True)
class Input:
    name: str
    path: Path | None = None
    data: bytes | None = None
    content_type: str = ""
    text: str | None = None  # already extracted (a chat adapter may have it)


def collect_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Input], list[FileResult], list[str]]:
    """Files to load (folders walked recursively, hidden files and folders left
    out), paths that do not exist (as failures), and unsupported files found in
    folders (skipped: a folder of mixed files is normal). A file named
    explicitly is always tried, so its failure is reported."""
    inputs: list[Input] = []
    missing: list[FileResult] = []
    skipped: list[str] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_file():
            inputs.append(Input(path.name, path))
        elif path.is_dir():
            root_name = path.resolve().name or str(path)
            # Symlinked folders are not followed: they can loop.
            for folder, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for filename in sorted(files):
                    if filename.startswith("."):
                        continue
                    full = Path(folder) / filename
                    name = f"{root_name}/{full.relative_to(path).as_posix()}"
                    if document_kind(filename) is None:
                        skipped.append(name)
                    else:
                        inputs.append(Input(name, full))
        else:
            missing.append(FileResult(str(raw), "failed", reason="no such file or folder"))
    return inputs, missing, skipped


# -- reading one file (in worker threads) -------------------------------------
@dataclass(slots=True)
class Chunking:
    counter: TokenCounter
    max_tokens: int
    overlap_tokens: int


def open_input(item: Input) -> BinaryIO:
    if item.data is not None:
        return io.BytesIO(item.data)
    if item.path is None:
        raise ValueError(f"{item.name}: neither a path nor data")
    return item.path.open("rb")


def scan_file_of(item: Input) -> ScannedFile:
    """The file's content key and encoding (OSError, DocumentError)."""
    if item.text:
        return ScannedFile(hashlib.sha256(item.text.encode("utf-8")).hexdigest(), "markdown")
    with open_input(item) as stream:
        return scan_file(item.name, stream, item.content_type)


def read_chunks(item: Input, scanned: ScannedFile, chunking: Chunking) -> Generator[Chunk, None, None]:
    """The file's passages, read and packed as they are asked for."""
    if item.text:
        lines = (line.rstrip("\n") for line in io.StringIO(item.text.replace("\r\n", "\n").replace("\r", "\n")))
        yield from iter_chunks(iter_markdown_sections(lines), *chunking_args(chunking))
        return
    with open_input(item) as stream:
        yield from iter_chunks(stream_sections(stream, scanned), *chunking_args(chunking))


def chunking_args(chunking: Chunking) -> tuple[TokenCounter, int, int]:
    return chunking.counter, chunking.max_tokens, chunking.overlap_tokens


@dataclass(slots=True)
class FileProgress:
    """A file being loaded: its counts, kept while its passages stream through."""

    index: int
    name: str
    sha256: str
    passages: int = 0  # chunked so far
    added: int = 0
    existing: int = 0


@dataclass(slots=True)
class Piece:
    """One passage on its way to the store."""

    file: FileProgress
    passage: Passage
    hash: str


@dataclass(slots=True)
class Batch:
    """Fresh passages of one read, and the files completely read by then."""

    pieces: list[Piece] = field(default_factory=list)
    finished: list[FileProgress] = field(default_factory=list)


def read_batch(
    chunks: Iterator[Chunk], file: FileProgress, size: int, loaded_at: datetime, place: str = DM_KEY
) -> tuple[list[Piece], bool]:
    """Up to `size` passages of the file (in a worker thread), and whether it
    ended; each records the conversation key `place` it was shared in."""
    pieces: list[Piece] = []
    for chunk in chunks:
        passage = Passage(
            text=chunk.text, source=file.name, position=chunk.position or None, created_at=loaded_at, place=place
        )
        pieces.append(Piece(file, passage, passage_hash(chunk.text)))
        if len(pieces) >= size:
            return pieces, False
    return pieces, True
