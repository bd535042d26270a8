"""Load files and folders into archival storage: an agent's own, or a shared
collection's (a collection is an agent record too, see memory/store.py).

The work is a pipeline, so the embedding model, the slowest part, never waits:
files are read, extracted, chunked and hashed in a worker thread, a file ahead
of the model; passages are embedded in batches on the Embedder's own thread
(the one thread that may touch the model: Hugging Face's fast tokenizers fail
with "Already borrowed" when two threads encode at once); and each batch is
written, vectors included, by the store's thread while the next one embeds.
The event loop only hands batches along, so a bot that loads a collection
keeps answering chat.

Re-loading is cheap and safe. A file whose bytes (sha256) were loaded before
is skipped whole. Inside a file every passage has a content hash stored with
it, and passages already held are neither embedded nor stored again; a file
is recorded as loaded only after its last passage is committed. So a load
that was interrupted (Ctrl-C, a crash, a failing model) is resumed by running
it again, and ends with exactly the passages one clean run would have stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from memory.archival import ArchivalMemory
from memory.embeddings import MAX_BATCH
from memory.ingest.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP_TOKENS, chunk_document, chunk_text
from memory.ingest.documents import Document, DocumentError, document_kind, extract_document
from memory.store import DocumentRecord, Store
from memory.tokens import TokenCounter, load_encoder
from memory.types import Passage, utc_now

log = logging.getLogger(__name__)

# Passages per store commit: large enough that commits cost little, small
# enough that an interrupted load loses at most a few seconds of embedding.
WRITE_BATCH = 256
# Passages prepared ahead of the model, in windows: enough that each window
# is full (large, length-sorted model batches), bounded so a huge folder does
# not sit in memory.
WINDOWS_AHEAD = 2

Status = Literal["loaded", "unchanged", "failed"]


class BatchEmbedder(Protocol):
    async def embed(self, texts: Sequence[str]) -> np.ndarray: ...


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


def passage_hash(text: str) -> str:
    """Content key of a passage: whitespace differences do not make it new."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


# -- what to load --------------------------------------------------------------
@dataclass(slots=True)
class _Input:
    name: str
    path: Path | None = None
    data: bytes | None = None
    content_type: str = ""
    text: str | None = None  # already extracted (a chat adapter may have it)


def collect_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[_Input], list[FileResult], list[str]]:
    """Files to load (folders walked recursively, hidden files and folders left
    out), paths that do not exist (as failures), and unsupported files found in
    folders (skipped: a folder of mixed files is normal). A file named
    explicitly is always tried, so its failure is reported."""
    inputs: list[_Input] = []
    missing: list[FileResult] = []
    skipped: list[str] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_file():
            inputs.append(_Input(path.name, path))
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
                        inputs.append(_Input(name, full))
        else:
            missing.append(FileResult(str(raw), "failed", reason="no such file or folder"))
    return inputs, missing, skipped


# -- preparing one file (in a worker thread) ----------------------------------
@dataclass(slots=True)
class _Prepared:
    index: int
    name: str
    sha256: str
    passages: list[Passage]
    hashes: list[str]
    fresh: list[int] = field(default_factory=list)  # passages not stored yet, by position
    remaining: int = 0  # fresh passages not yet committed
    added: int = 0
    existing: int = 0


@dataclass(slots=True)
class _Chunking:
    counter: TokenCounter
    max_tokens: int
    overlap_tokens: int


def _prepare(
    index: int, item: _Input, loaded: dict[str, DocumentRecord], chunking: _Chunking, loaded_at: datetime
) -> _Prepared | FileResult:
    try:
        data = item.data if item.data is not None else item.path.read_bytes() if item.path else b""
    except OSError as error:
        return FileResult(item.name, "failed", reason=f"cannot read it ({error.strerror or error})")
    sha = hashlib.sha256(item.text.encode("utf-8") if item.text else data).hexdigest()
    earlier = loaded.get(sha)
    if earlier is not None:
        return FileResult(
            item.name,
            "unchanged",
            passages_existing=earlier.passages,
            reason="" if earlier.name == item.name else f"same content as {earlier.name}",
        )
    try:
        if item.text:
            chunks = chunk_text(item.text, chunking.counter, chunking.max_tokens, chunking.overlap_tokens)
        else:
            document: Document = extract_document(item.name, data, item.content_type)
            chunks = chunk_document(document, chunking.counter, chunking.max_tokens, chunking.overlap_tokens)
    except DocumentError as error:
        return FileResult(item.name, "failed", reason=str(error))
    except Exception as error:
        # A bug or a parser choking on odd input must cost this file, not the load.
        log.exception("loading %s failed", item.name)
        return FileResult(item.name, "failed", reason=f"{type(error).__name__}: {error}")
    passages = [
        Passage(text=chunk.text, source=item.name, position=chunk.position or None, created_at=loaded_at)
        for chunk in chunks
    ]
    return _Prepared(index, item.name, sha, passages, [passage_hash(chunk.text) for chunk in chunks])


# -- the pipeline ---------------------------------------------------------------
class _ProducerFailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Loader:
    def __init__(
        self,
        store: Store,
        embedder: BatchEmbedder,
        agent_id: str,
        chunking: _Chunking,
        *,
        write_batch: int,
        embed_batch: int,
        progress: bool | None,
        label: str,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.agent_id = agent_id
        self.chunking = chunking
        self.write_batch = max(1, write_batch)
        self.embed_batch = max(1, embed_batch)
        self.loaded_at = utc_now()
        self.results: dict[int, FileResult] = {}
        self._bar = _progress_bar(progress, label)
        self._ahead = 0  # fresh passages prepared and not yet taken by the consumer
        self._room = asyncio.Condition()

    async def run(self, inputs: list[_Input]) -> list[FileResult]:
        loaded = {record.sha256: record for record in await self.store.list_documents(self.agent_id)}
        queue: asyncio.Queue[_Prepared | _ProducerFailed | None] = asyncio.Queue()
        producer = asyncio.create_task(self._produce(inputs, loaded, queue), name="loader-prepare")
        try:
            await self._consume(queue)
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            self._bar.close()
        return [self.results[n] for n in sorted(self.results)]

    async def _produce(
        self,
        inputs: list[_Input],
        loaded: dict[str, DocumentRecord],
        queue: asyncio.Queue[_Prepared | _ProducerFailed | None],
    ) -> None:
        try:
            seen: dict[str, DocumentRecord] = dict(loaded)
            for index, item in enumerate(inputs):
                prepared = await asyncio.to_thread(_prepare, index, item, seen, self.chunking, self.loaded_at)
                if isinstance(prepared, FileResult):
                    self.results[index] = prepared
                    continue
                # The same bytes twice in one run: the second is a duplicate, not new work.
                seen[prepared.sha256] = DocumentRecord(
                    prepared.sha256, prepared.name, len(prepared.passages), self.loaded_at
                )
                known = await self.store.known_passage_hashes(self.agent_id, prepared.hashes)
                prepared.fresh = [n for n, h in enumerate(prepared.hashes) if h not in known]
                prepared.remaining = len(prepared.fresh)
                prepared.existing = len(prepared.passages) - len(prepared.fresh)
                self._bar.total = (self._bar.total or 0) + len(prepared.fresh)
                self._bar.refresh()
                async with self._room:
                    await self._room.wait_for(lambda: self._ahead < WINDOWS_AHEAD * self.write_batch)
                    self._ahead += len(prepared.fresh)
                await queue.put(prepared)
        except Exception as error:
            await queue.put(_ProducerFailed(error))
            return
        await queue.put(None)

    async def _consume(self, queue: asyncio.Queue[_Prepared | _ProducerFailed | None]) -> None:
        pending: deque[tuple[_Prepared, int]] = deque()
        vectors_for: list[tuple[_Prepared, int]] = []  # embedded, not yet handed to a write
        embedded: list[tuple[_Prepared, int]] = []
        finished: list[_Prepared] = []  # files whose every passage is embedded (or was stored before)
        writing: asyncio.Task[None] | None = None
        done = False
        try:
            while True:
                # Fill a window, but never keep the model waiting for a slow file.
                while not done and len(pending) < self.write_batch and not (pending and queue.empty()):
                    item = await queue.get()
                    if item is None:
                        done = True
                    elif isinstance(item, _ProducerFailed):
                        raise item.error
                    elif item.fresh:
                        pending.extend((item, n) for n in item.fresh)
                        async with self._room:
                            self._ahead -= len(item.fresh)
                            self._room.notify_all()
                    else:
                        finished.append(item)
                if not pending:
                    break
                window = [pending.popleft() for _ in range(min(self.write_batch, len(pending)))]
                # The model pads every batch to its longest text: texts of like
                # length together waste least (what one big encode call does),
                # while small calls keep a chat query's wait to one batch.
                window.sort(key=lambda item: len(item[0].passages[item[1]].text))
                for start in range(0, len(window), self.embed_batch):
                    batch = window[start : start + self.embed_batch]
                    vectors = await self.embedder.embed([doc.passages[n].text for doc, n in batch])
                    for (doc, n), vector in zip(batch, vectors, strict=True):
                        doc.passages[n].embedding = vector.tolist()
                    vectors_for.extend(batch)
                self._hand_over(vectors_for, embedded, finished)
                writing = await self._start_write(writing, embedded, finished)
        finally:
            # Whatever was embedded is kept, even when the load stops early: a
            # re-run then has less to do.
            self._hand_over(vectors_for, embedded, finished)
            if embedded or finished:
                writing = await self._start_write(writing, embedded, finished)
            if writing is not None:
                await writing

    @staticmethod
    def _hand_over(
        vectors_for: list[tuple[_Prepared, int]], embedded: list[tuple[_Prepared, int]], finished: list[_Prepared]
    ) -> None:
        """Move embedded passages to the write buffer in document order (so
        passage ids follow the files), noting files now complete."""
        vectors_for.sort(key=lambda item: (item[0].index, item[1]))
        for doc, n in vectors_for:
            embedded.append((doc, n))
            doc.remaining -= 1
            if doc.remaining == 0:
                finished.append(doc)
        vectors_for.clear()

    async def _start_write(
        self,
        writing: asyncio.Task[None] | None,
        embedded: list[tuple[_Prepared, int]],
        finished: list[_Prepared],
    ) -> asyncio.Task[None]:
        """Wait for the previous batch's write (writes stay in order), then
        start this one in the background and clear the buffers."""
        if writing is not None:
            await writing
        task = asyncio.create_task(self._write(list(embedded), list(finished)), name="loader-write")
        embedded.clear()
        finished.clear()
        return task

    async def _write(self, items: list[tuple[_Prepared, int]], finished: list[_Prepared]) -> None:
        if items:
            ids = await self.store.insert_hashed_passages(
                self.agent_id, [doc.passages[n] for doc, n in items], [doc.hashes[n] for doc, n in items]
            )
            for (doc, _), new_id in zip(items, ids, strict=True):
                if new_id:
                    doc.added += 1
                else:  # stored meanwhile by another load, or repeated inside this file
                    doc.existing += 1
            self._bar.update(len(items))
        for doc in finished:
            # Only now is every passage of the file committed.
            await self.store.record_document(
                self.agent_id, DocumentRecord(doc.sha256, doc.name, len(doc.passages), self.loaded_at)
            )
            self.results[doc.index] = FileResult(doc.name, "loaded", doc.added, doc.existing)


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
def _target(target: ArchivalMemory | Store, embedder: BatchEmbedder | None) -> tuple[Store, BatchEmbedder]:
    if isinstance(target, ArchivalMemory):
        return target.store, embedder or target.embedder
    if embedder is None:
        raise TypeError("load_paths(store, ...) needs embedder=")
    return target, embedder


async def load_paths(
    target: ArchivalMemory | Store,
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
        _Chunking(counter or _default_counter(), max_tokens, overlap_tokens),
        write_batch=write_batch,
        embed_batch=embed_batch,
        progress=progress,
        label=label,
    )
    files = await loader.run(inputs)
    return LoadReport(missing + files, skipped, time.perf_counter() - started)


async def load_document(
    target: ArchivalMemory | Store,
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
) -> FileResult:
    """One file held in memory (a chat upload); `text` if already extracted."""
    store, model = _target(target, embedder)
    loader = _Loader(
        store,
        model,
        agent_id,
        _Chunking(counter or _default_counter(), max_tokens, overlap_tokens),
        write_batch=WRITE_BATCH,
        embed_batch=MAX_BATCH,
        progress=False,
        label=name,
    )
    [result] = await loader.run([_Input(name, data=data, content_type=content_type, text=text)])
    return result


def _default_counter() -> TokenCounter:
    return TokenCounter(load_encoder(""))
