"""Load files and folders into archival storage: an agent's own, or a shared
collection's (a collection is an agent record too, see SourceStore in memory/roles.py).

Files are streamed, so memory does not grow with file size: a file is read
twice in blocks, once to hash it (sha256, to skip files loaded before) and once
to extract, chunk and hash its passages (memory/ingest/documents.py says how
each format streams). The work is a pipeline in which the embedding model, the
slowest part, never waits: passages are prepared in a worker thread a batch or
two ahead of the model; embedded in batches on the Embedder's own thread (the
one thread that may touch the model: Hugging Face's fast tokenizers fail with
"Already borrowed" when two threads encode at once), two batches in flight so
the model goes from one to the next; and each window of passages is written,
vectors included, by the store's thread while the next one embeds. At most a
few windows of passages are held at any time, whatever the file's size. The
event loop only hands batches along, so a bot that loads a collection keeps
answering chat.

Re-loading is cheap and safe. A file whose bytes (sha256) were loaded before
is skipped whole. Inside a file every passage has a content hash stored with
it, and passages already held are neither embedded nor stored again; a file
is recorded as loaded only after its last passage is committed. So a load
that was interrupted (Ctrl-C, a crash, a failing model) is resumed by running
it again, and ends with exactly the passages one clean run would have stored.
A file whose extraction fails part-way (a PDF damaged on page 40) is reported
failed and keeps the passages before the failure, like an interrupted load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from memory.archival import ArchivalMemory
from memory.embeddings import MAX_BATCH
from memory.ingest.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP_TOKENS
from memory.ingest.documents import (
    DocumentError,
    ScannedFile,
)
from memory.ingest.reading import (
    Batch,
    Chunking,
    FileProgress,
    FileResult,
    Input,
    Piece,
    Status,
    collect_files,
    read_batch,
    read_chunks,
    scan_file_of,
)
from memory.places import DM_KEY
from memory.roles import DocumentStore
from memory.tokens import TokenCounter, load_encoder
from memory.types import DocumentRecord, utc_now

log = logging.getLogger(__name__)

# Passages per store commit: large enough that commits cost little, small
# enough that an interrupted load loses at most a few seconds of embedding.
WRITE_BATCH = 256
# Windows of passages prepared ahead of the model: enough that the next window
# is ready when the model wants it, bounded so a huge file does not sit in memory.
WINDOWS_AHEAD = 2
# Model batches handed to the embedder at once: it starts the next while the
# loader takes the last one's vectors, and a chat query waits behind at most two.
EMBEDS_IN_FLIGHT = 2


class BatchEmbedder(Protocol):
    async def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(slots=True)
class LoadReport:
    files: list[FileResult] = field(default_factory=list)
    # Files in the given folders that are not text, Markdown, HTML or PDF.
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def _with(self, status: Status) -> list[FileResult]:
        return [result for result in self.files if result.status == status]

    @property
    def loaded(self) -> list[FileResult]:
        return self._with("loaded")

    @property
    def unchanged(self) -> list[FileResult]:
        return self._with("unchanged")

    @property
    def failed(self) -> list[FileResult]:
        return self._with("failed")

    @property
    def passages_added(self) -> int:
        return sum(result.passages_added for result in self.files)

    @property
    def passages_per_second(self) -> float:
        return self.passages_added / self.seconds if self.seconds > 0 else 0.0


# -- the pipeline ---------------------------------------------------------------
class _ProducerFailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass(slots=True)
class _Window:
    """Passages embedded and written together, and the files complete with them."""

    pieces: list[Piece]
    finished: list[FileProgress]
    unembedded: int = 0  # model batches not back yet


class _Loader:
    def __init__(
        self,
        store: DocumentStore,
        embedder: BatchEmbedder,
        agent_id: str,
        chunking: Chunking,
        *,
        write_batch: int,
        embed_batch: int,
        progress: bool | None,
        label: str,
        place: str = DM_KEY,
    ) -> None:
        self.store = store
        self.place = place  # the conversation key the passages record (memory/places.py)
        self.embedder = embedder
        self.agent_id = agent_id
        self.chunking = chunking
        self.write_batch = max(1, write_batch)
        self.embed_batch = max(1, embed_batch)
        self.loaded_at = utc_now()
        self.results: dict[int, FileResult] = {}
        self._bar = _progress_bar(progress, label)
        # Batches read ahead of the model: the bound on what a load holds.
        self._queue: asyncio.Queue[Batch | _ProducerFailed | None] = asyncio.Queue(maxsize=WINDOWS_AHEAD)
        self._writing: asyncio.Task[None] | None = None

    async def run(self, inputs: list[Input]) -> list[FileResult]:
        loaded = {record.sha256: record for record in await self.store.list_documents(self.agent_id)}
        producer = asyncio.create_task(self._produce(inputs, loaded), name="loader-read")
        try:
            await self._consume()
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            self._bar.close()
        return [self.results[n] for n in sorted(self.results)]

    # -- reading ahead --------------------------------------------------------
    async def _produce(self, inputs: list[Input], loaded: dict[str, DocumentRecord]) -> None:
        try:
            seen: dict[str, DocumentRecord | FileProgress] = dict(loaded)
            for index, item in enumerate(inputs):
                started = await self._start_file(index, item, seen)
                if started is not None:
                    await self._read_file(item, *started)
        except Exception as error:
            await self._queue.put(_ProducerFailed(error))
            return
        await self._queue.put(None)

    async def _start_file(
        self, index: int, item: Input, seen: dict[str, DocumentRecord | FileProgress]
    ) -> tuple[FileProgress, ScannedFile] | None:
        try:
            scanned = await asyncio.to_thread(scan_file_of, item)
        except OSError as error:
            self.results[index] = FileResult(item.name, "failed", reason=f"cannot read it ({error.strerror or error})")
            return None
        except DocumentError as error:
            self.results[index] = FileResult(item.name, "failed", reason=str(error))
            return None
        earlier = seen.get(scanned.sha256)
        if earlier is not None:
            # Loaded before, or the same bytes earlier in this run: a duplicate, not new work.
            self.results[index] = FileResult(
                item.name,
                "unchanged",
                passages_existing=earlier.passages,
                reason="" if earlier.name == item.name else f"same content as {earlier.name}",
            )
            return None
        file = FileProgress(index, item.name, scanned.sha256)
        seen[scanned.sha256] = file
        return file, scanned

    async def _read_file(self, item: Input, file: FileProgress, scanned: ScannedFile) -> None:
        chunks = read_chunks(item, scanned, self.chunking)
        try:
            ended = False
            while not ended:
                try:
                    pieces, ended = await asyncio.to_thread(
                        read_batch, chunks, file, self.write_batch, self.loaded_at, self.place
                    )
                except DocumentError as error:
                    self.results[file.index] = FileResult(file.name, "failed", reason=str(error))
                    return
                except Exception as error:
                    # A bug or a parser choking on odd input must cost this file, not the load.
                    log.exception("loading %s failed", file.name)
                    reason = f"{type(error).__name__}: {error}"
                    self.results[file.index] = FileResult(file.name, "failed", reason=reason)
                    return
                file.passages += len(pieces)
                known = await self.store.known_passage_hashes(self.agent_id, [piece.hash for piece in pieces])
                fresh = [piece for piece in pieces if piece.hash not in known]
                file.existing += len(pieces) - len(fresh)
                self._bar.total = (self._bar.total or 0) + len(fresh)
                self._bar.refresh()
                await self._queue.put(Batch(fresh, [file] if ended else []))
        finally:
            # Closes the file; a read still running in its thread (the load was
            # cancelled) finishes on its own and the file closes when collected.
            with contextlib.suppress(ValueError):
                chunks.close()

    # -- embedding and writing -----------------------------------------------------
    async def _windows(self) -> AsyncIterator[_Window]:
        """Windows of up to write_batch passages, in file order; a window is cut
        short rather than keep the model waiting for a slow file."""
        done = False
        while not done:
            window = _Window([], [])
            while not done and len(window.pieces) < self.write_batch:
                if window.pieces and self._queue.empty():
                    break
                item = await self._queue.get()
                if item is None:
                    done = True
                elif isinstance(item, _ProducerFailed):
                    raise item.error
                else:
                    window.pieces.extend(item.pieces)
                    window.finished.extend(item.finished)
            if window.pieces or window.finished:
                yield window

    async def _consume(self) -> None:
        in_flight: deque[tuple[_Window, list[Piece], asyncio.Task[np.ndarray]]] = deque()
        windows: deque[_Window] = deque()  # not yet written, in order
        try:
            async for window in self._windows():
                windows.append(window)
                # The model pads every batch to its longest text: texts of like
                # length together waste least (what one big encode call does),
                # while small calls keep a chat query's wait short.
                by_length = sorted(window.pieces, key=lambda piece: len(piece.passage.text))
                for start in range(0, len(by_length), self.embed_batch):
                    batch = by_length[start : start + self.embed_batch]
                    if len(in_flight) >= EMBEDS_IN_FLIGHT:
                        await self._settle(in_flight.popleft(), windows)
                    texts = [piece.passage.text for piece in batch]
                    in_flight.append((window, batch, asyncio.ensure_future(self.embedder.embed(texts))))
                    window.unembedded += 1
                await self._write_ready(windows)
            while in_flight:
                await self._settle(in_flight.popleft(), windows)
            await self._write_ready(windows)
        finally:
            for _, _, task in in_flight:
                task.cancel()
            await asyncio.gather(*(task for _, _, task in in_flight), return_exceptions=True)
            # Whatever was embedded is kept, even when the load stops early: a
            # re-run then has less to do. Files of an unfinished window are not
            # recorded: a re-run finds their passages stored and records them.
            for window in windows:
                embedded = [piece for piece in window.pieces if piece.passage.embedding is not None]
                if window.unembedded == 0:
                    await self._start_write(embedded, window.finished)
                elif embedded:
                    await self._start_write(embedded, [])
            if self._writing is not None:
                await self._writing
            windows.clear()

    async def _settle(
        self, flight: tuple[_Window, list[Piece], asyncio.Task[np.ndarray]], windows: deque[_Window]
    ) -> None:
        window, batch, task = flight
        vectors = await task
        for piece, vector in zip(batch, vectors, strict=True):
            piece.passage.embedding = vector.tolist()
        window.unembedded -= 1
        await self._write_ready(windows)

    async def _write_ready(self, windows: deque[_Window]) -> None:
        while windows and windows[0].unembedded == 0:
            window = windows.popleft()
            await self._start_write(window.pieces, window.finished)

    async def _start_write(self, pieces: list[Piece], finished: list[FileProgress]) -> None:
        """Wait for the previous window's write (writes stay in order), then
        start this one in the background."""
        if self._writing is not None:
            await self._writing
        self._writing = asyncio.create_task(self._write(pieces, finished), name="loader-write")

    async def _write(self, pieces: list[Piece], finished: list[FileProgress]) -> None:
        if pieces:
            ids = await self.store.insert_hashed_passages(
                self.agent_id, [piece.passage for piece in pieces], [piece.hash for piece in pieces]
            )
            for piece, new_id in zip(pieces, ids, strict=True):
                if new_id:
                    piece.file.added += 1
                else:  # stored meanwhile by another load, or repeated inside this file
                    piece.file.existing += 1
            self._bar.update(len(pieces))
        for file in finished:
            # Only now is every passage of the file committed.
            await self.store.record_document(
                self.agent_id, DocumentRecord(file.sha256, file.name, file.passages, self.loaded_at)
            )
            self.results[file.index] = FileResult(file.name, "loaded", file.added, file.existing)


class _NoBar:
    total: int | None = 0

    def update(self, n: int = 1) -> None: ...

    def refresh(self) -> None: ...

    def close(self) -> None: ...


def _progress_bar(progress: bool | None, label: str) -> Any:
    """tqdm on standard error, shown only once a load has run a few seconds."""
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=0, desc=label, unit="passage", file=sys.stderr, delay=2.0, smoothing=0.1, leave=True)


# -- entry points ---------------------------------------------------------------
def _target(
    target: ArchivalMemory | DocumentStore, embedder: BatchEmbedder | None
) -> tuple[DocumentStore, BatchEmbedder]:
    if isinstance(target, ArchivalMemory):
        if not isinstance(target.store, DocumentStore):
            raise TypeError(f"{type(target.store).__name__} cannot keep loaded documents")
        return target.store, embedder or target.embedder
    if embedder is None:
        raise TypeError("load_paths(store, ...) needs embedder=")
    return target, embedder


async def load_paths(
    target: ArchivalMemory | DocumentStore,
    agent_id: str,
    paths: Iterable[str | os.PathLike[str]],
    *,
    embedder: BatchEmbedder | None = None,
    counter: TokenCounter | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    write_batch: int = WRITE_BATCH,
    embed_batch: int = MAX_BATCH,
    progress: bool | None = None,
    label: str = "loading",
) -> LoadReport:
    """Load files and folders into `agent_id`'s archival storage.

    A file that cannot be read is reported (in the result) and the others
    still load; a failure of the model or the store stops the load with that
    error, keeping everything committed so far (run it again to continue).
    """
    started = time.perf_counter()
    store, model = _target(target, embedder)
    inputs, missing, skipped = await asyncio.to_thread(collect_files, paths)
    loader = _Loader(
        store,
        model,
        agent_id,
        Chunking(counter or _default_counter(), max_tokens, overlap_tokens),
        write_batch=write_batch,
        embed_batch=embed_batch,
        progress=progress,
        label=label,
    )
    files = await loader.run(inputs)
    return LoadReport(missing + files, skipped, time.perf_counter() - started)


async def load_document(
    target: ArchivalMemory | DocumentStore,
    agent_id: str,
    name: str,
    data: bytes = b"",
    content_type: str = "",
    *,
    text: str | None = None,
    embedder: BatchEmbedder | None = None,
    counter: TokenCounter | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    place: str = DM_KEY,
) -> FileResult:
    """One file held in memory (a chat upload); `text` if already extracted;
    its passages are visible as from `place`, where it was shared."""
    store, model = _target(target, embedder)
    loader = _Loader(
        store,
        model,
        agent_id,
        Chunking(counter or _default_counter(), max_tokens, overlap_tokens),
        write_batch=WRITE_BATCH,
        embed_batch=MAX_BATCH,
        progress=False,
        label=name,
        place=place,
    )
    [result] = await loader.run([Input(name, data=data, content_type=content_type, text=text)])
    return result


def _default_counter() -> TokenCounter:
    return TokenCounter(load_encoder(""))
