"""A shared tier's writes, off the engine thread: a bounded queue and one writer thread.

Publishing a block to a shared pool (``TieredStore.publish``) happens as the pool names
it, on the engine thread, for every computed block; sealing a frame (a keyed BLAKE2b of
~0.4 MB) and a Redis round trip -- or a socket timeout when Redis stalls -- would be paid
there by every stream. So :class:`SharedWriter` takes the frame and returns at once;
its thread seals it, tags its index entry and writes both. When ``max_pending`` writes
already wait, a put fails at once (counted ``write_queue_full``): sharing is a cache, the
block is recomputed by whoever misses it. A write that fails in the thread is counted by
its kind; the block stays in the writer's local view, and a read of it is a ``lost``
miss. ``close`` waits for the queue to drain, within a bound.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from kvmap.kv.tiers.base import TierError

log = logging.getLogger(__name__)
MAX_PENDING = 256            # frames waiting to be written (~100 MB of SmolLM2 bf16 blocks)
CLOSE_WAIT_S = 10.0


class SharedWriter:
    """Runs ``write(job)`` for each submitted job on a thread of its own; a
    ``TierError`` it raises goes to ``on_error(kind)``."""

    def __init__(self, write: Callable, on_error: Callable[[str], None],
                 max_pending: int = MAX_PENDING) -> None:
        self._write = write
        self._on_error = on_error
        self._queue: queue.Queue = queue.Queue(max_pending)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job) -> None:
        """Queue ``job``; TierError("write_queue_full") when the queue is full."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="kvmap-shared-writer")
                self._thread.start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise TierError("write_queue_full", "the shared pool's writer is behind") \
                from None

    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(job)
            except TierError as e:
                self._on_error(e.kind)
            except Exception:       # noqa: BLE001 -- a write never takes the tier down
                log.exception("a shared-pool write failed")
                self._on_error("writer")
            finally:
                self._queue.task_done()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Write what is queued (waiting at most ``wait_s``), then stop the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            self._queue.put(None, timeout=wait_s)
        except queue.Full:
            return
        thread.join(wait_s)
