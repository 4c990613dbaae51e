"""Peak KV tracking kept by the block pool: allocations and prefix-cache hits raise it,
frees do not lower it, ``reset_peak`` opens a new window; ``track_peak_kv_bytes`` reads it
and nests without hiding an outer peak."""
from __future__ import annotations

from types import SimpleNamespace

from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.kv.pool import BlockPool


def test_pool_peak_follows_allocate_incref_and_reset():
    pool = BlockPool(num_blocks=8, block_size=4)
    assert pool.peak_num_used_blocks == 0
    a = pool.allocate(3)
    b = pool.allocate(2)
    assert pool.peak_num_used_blocks == 5
    pool.register_hash(a[0], b"h0")
    pool.free(a + b)
    assert pool.num_used == 0 and pool.peak_num_used_blocks == 5     # frees keep the peak
    pool.reset_peak()
    assert pool.peak_num_used_blocks == 0
    assert pool.lookup([b"h0"]) == [a[0]]                            # a cache hit is a use
    assert pool.peak_num_used_blocks == 1
    pool.incref(a[0])                                                # already used: no change
    assert pool.peak_num_used_blocks == 1
    pool.allocate(4)
    assert pool.peak_num_used_blocks == 5
    pool.check_integrity()


def test_track_peak_kv_bytes_reads_the_pool_and_nests():
    pool = BlockPool(num_blocks=16, block_size=4)
    engine = SimpleNamespace(kv=SimpleNamespace(pool=pool, bytes_per_block=100, staging_bytes=0))
    held = pool.allocate(2)
    with track_peak_kv_bytes(engine) as outer:
        big = pool.allocate(6)                 # 8 used
        pool.free(big)
        with track_peak_kv_bytes(engine) as inner:
            pool.free(pool.allocate(1))        # 3 used
        assert inner[0] == 300
    assert outer[0] == 800                     # the inner window did not hide the 8
    pool.free(held)
    assert not hasattr(BlockPool, "_tracked") and "allocate" not in vars(pool)  # no patching


def test_tiny_llm_peak_counts_the_prefill(tiny_llm):
    from kvmap import SamplingParams
    with track_peak_kv_bytes(tiny_llm.engine) as peak:
        tiny_llm.generate([list(range(1, 41))], SamplingParams(max_tokens=2))
    # 41 tokens resident at the end of the run: 11 blocks of 4 (fp32 tiny model, 2048 B)
    assert peak[0] == 11 * tiny_llm.engine.kv.bytes_per_block
