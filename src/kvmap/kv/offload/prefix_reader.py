"""Reading a prefix's block frames out of the tiers: ahead of time, or when needed.

A waiting request's prefix blocks that live in a tier are read (``tier.get``) and
checked (CRC, names, dtypes, shapes: ``BlockFrames.decode``) on a background thread
while the model runs the current step (:meth:`PrefixReader.read_ahead`); the fetch at its
admission (``TieredStore._fetch``) then takes the frame from there, waiting only for a
read still running (:meth:`PrefixReader.read`). Copying the frame into a pool block
stays on the engine thread.

Every tier call, from either thread, holds the store's ``lock`` (as the pager's prefetch
does); the store's counters are updated on the engine thread only:
``tier_fetch_read_s`` (time reading + checking, either thread) and
``tier_fetch_hidden_s`` (the part of it spent while the engine did other work).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from kvmap.hardware.omp_team import serial_executor
from kvmap.kv.tiers import serde
from kvmap.kv.offload.frames import FrameMismatch

MAX_READ_AHEAD_BLOCKS = 128     # frames held read ahead; past it the oldest is dropped


class FrameRead(NamedTuple):
    """One prefix frame as read: ``level`` None when no level holds it; ``frame`` None
    when it failed its checks (``error`` names the kind), else decoded (a ``Frame``) or,
    for a layer-wise load, the checked raw bytes."""

    level: Any
    frame: Any
    num_bytes: int
    error: str | None
    seconds: float


class PrefixReader:
    """The read-ahead of one tiered store (``store.py``)."""

    def __init__(self, store, max_blocks: int = MAX_READ_AHEAD_BLOCKS) -> None:
        self.store = store
        self.max_blocks = max_blocks
        self._ahead: dict[bytes, Future] = {}      # block hash -> its frame being read
        self._executor: ThreadPoolExecutor | None = serial_executor(
            "kvmap-prefix-read")      # a thread once first used

    def read_ahead(self, block_hashes: list[bytes]) -> None:
        """Start reading the frames of ``block_hashes`` (a waiting request's prefix)
        that the pool lacks and a level holds, up to the first one held nowhere.
        Engine thread only."""
        store, pool = self.store, self.store.kv.pool
        with store.lock:
            for h in block_hashes:
                if len(self._ahead) >= self.max_blocks:    # the oldest, never taken
                    self._ahead.pop(next(iter(self._ahead))).cancel()
                if h in pool.hash_to_block or h in self._ahead:
                    continue
                if not any(lv.tier.contains(h) for lv in store.levels):
                    break                                  # a prefix hit stops at a gap
                self._ahead[h] = self._executor.submit(self._read, h)
                store.stats.num_read_ahead_blocks += 1

    def read(self, block_hash: bytes) -> FrameRead:
        """The frame of ``block_hash``: its read-ahead (waited for if still running) or
        a read now. Engine thread only; counts what was hidden."""
        stats = self.store.stats
        future = self._ahead.pop(block_hash, None)
        if future is None:
            out = self._read(block_hash)
            stats.tier_fetch_read_s += out.seconds
            return out
        wait_start_s = time.perf_counter()
        out = future.result()
        waited_s = time.perf_counter() - wait_start_s
        stats.num_read_ahead_used += 1
        stats.tier_fetch_read_s += out.seconds
        stats.tier_fetch_hidden_s += max(0.0, out.seconds - waited_s)
        return out

    def read_for_layers(self, block_hash: bytes, layout) -> FrameRead:
        """The frame of ``block_hash`` for a layer-wise load (``layer_loader.py``): its
        read-ahead, decoded (waited for if still running), or the raw bytes read now and
        checked against ``layout`` (a ``FrameLayout``: CRC and skeleton), not decoded.
        Engine thread only."""
        if block_hash in self._ahead:
            return self.read(block_hash)
        out = self._read(block_hash, layout)
        self.store.stats.tier_fetch_read_s += out.seconds
        return out

    def _read(self, block_hash: bytes, layout=None) -> FrameRead:
        """Read and check the frame from the highest level holding it (any thread); a
        frame that fails its checks is deleted from its level. With ``layout``, the
        frame is checked against it and returned as raw bytes, else decoded."""
        store = self.store
        start_s = time.perf_counter()
        with store.lock:
            for level in store.levels:
                data = level.tier.get(block_hash)   # a level without it: a miss, no I/O
                if data is not None:
                    break
            else:
                return FrameRead(None, None, 0, None, time.perf_counter() - start_s)
        try:
            frame = store.frames.decode(data, level.codec) if layout is None \
                else _checked_raw(data, layout, store.frames, level.codec)
        except serde.DECODE_ERRORS as e:        # CorruptBlockError, FrameMismatch, ...
            with store.lock:
                level.tier.delete(block_hash)
            kind = "mismatch" if not isinstance(e, serde.CorruptBlockError) else \
                "nonfinite" if e.field == "nonfinite" else "corrupt"
            return FrameRead(level, None, len(data), kind, time.perf_counter() - start_s)
        return FrameRead(level, frame, len(data), None, time.perf_counter() - start_s)

    def close(self) -> None:
        """Stop the thread (a read running finishes first) and forget what was read."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self._ahead.clear()


def _checked_raw(data: bytes, layout, frames, codec):
    """``data`` checked against ``layout`` (CRC, skeleton) and returned raw, or, when
    its skeleton differs (a codec whose frames are not all alike), decoded and checked
    the ordinary way (``BlockFrames.decode``)."""
    try:
        layout.check(data)
        return data
    except FrameMismatch:
        return frames.decode(data, codec)
