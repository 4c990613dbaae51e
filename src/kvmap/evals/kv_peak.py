"""The most KV bytes resident in an engine's block pool over a block of code.

The pool keeps the count itself (``BlockPool.peak_num_used_blocks``, raised wherever a
block becomes used: ``allocate`` and a prefix-cache hit's ``incref``), so a prefill's
blocks count before a policy frees some; this only opens a window on it and reads it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def track_peak_kv_bytes(engine) -> Iterator[list[int]]:
    """Within the block, the most KV bytes resident in ``engine``'s block pool.

    Yields a one-item list; its value is the peak in bytes (block-granular) once the
    block exits. Windows nest: an inner window does not hide an earlier, higher peak from
    the window around it. With a codec that stages exact tokens outside the pool's blocks
    (KIVI's residual window, ``kv/codecs/staging.py``) the staging rows in use count too,
    sampled whenever blocks become used and at the end. ``engine=None`` (a server
    measured over HTTP, whose pool is not ours to read): the value stays None.
    """
    if engine is None:
        yield [None]
        return
    kv = engine.kv
    pool, bytes_per_block = kv.pool, kv.bytes_per_block
    outer_peak = pool.peak_num_used_blocks
    pool.reset_peak()
    peak = [pool.num_used * bytes_per_block]
    staged = [0]

    def sample() -> None:                 # blocks + staging rows, at this moment
        staged[0] = max(staged[0], kv.usage().resident_bytes)

    if kv.staging_bytes:
        pool.on_used.append(sample)
    try:
        yield peak
    finally:
        if kv.staging_bytes:
            pool.on_used.remove(sample)
            sample()
        blocks = (pool.peak_num_used_layer_blocks * kv.layer_block_bytes
                  if getattr(kv, "per_layer_tables", False)
                  else pool.peak_num_used_blocks * bytes_per_block)
        peak[0] = max(blocks, staged[0])
        pool.peak_num_used_blocks = max(outer_peak, pool.peak_num_used_blocks)
