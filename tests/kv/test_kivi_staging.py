"""KIVI's residual window in a staging pool (kv/codecs/staging.py): exact resident bytes,
the newest tokens exact bit for bit, the same reads and greedy tokens as a pool big
enough never to evict (the layout that kept a full-precision copy of every block), and
evicted or copied blocks falling back to their codes, never to another block's rows."""
from __future__ import annotations

import math

import pytest
import torch

from kvmap.kv.cache import PagedKVCache, num_blocks_for_budget
from kvmap.kv.codecs import CODECS
from kvmap.kv.spec import KVGeometry
from kvmap.request import SamplingParams

EMBEDDED = KVGeometry(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16)
BF16_BYTES_PER_TOKEN = 23_040
GEOM = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=64, block_size=8)


def kivi_bytes(geom: KVGeometry, bits: int, context: int, residual: int = 128) -> int:
    """Codes + scales + per-block flags, and ceil(R/bs) staging rows, all layers."""
    H, D, bs, L = geom.num_kv_heads, geom.head_dim, geom.block_size, geom.num_layers
    key = bs * H * D * bits // 8 + 2 * H * D * 2              # codes; r, z fp16 per channel
    value = bs * H * D * bits // 8 + bs * H * (D // 32) * 2 * 2   # codes; r, z per group
    block = key + value + 1 + 8 + 8                           # full, t0, stage
    row = 2 * bs * H * D * 2 + 3 * 8                          # exact K, V bf16; sid, owner, t1
    rows = -(-residual // bs)
    return (-(-context // bs) * block + rows * row) * L


@pytest.mark.parametrize("bits, ceiling", [(2, 0.3), (4, 0.4)])
def test_resident_bytes_at_4k_match_the_formula_and_the_target(bits, ceiling):
    codec = CODECS["kivi"](bits=bits, staging_seqs=1)
    expected = kivi_bytes(EMBEDDED, bits, 4096)
    assert codec.resident_bytes(EMBEDDED, 4096) == expected
    assert expected <= ceiling * BF16_BYTES_PER_TOKEN * 4096, expected / (23_040 * 4096)
    # a real cache (2 of the layers) of one sequence prefilled in chunks of 512, then
    # decoded to 4081 tokens (256 blocks, the last with one token: 7 + 1 exact blocks)
    geom = KVGeometry(2, 3, 64, 16)
    kv = PagedKVCache(codec, geom, 256, "cpu", torch.bfloat16)
    kv.pool.allocate(256)
    k = torch.randn(4081, 3, 64).to(torch.bfloat16)
    steps = [(i, min(i + 512, 4000)) for i in range(0, 4000, 512)]
    for a, b in steps + [(t, t + 1) for t in range(4000, 4081)]:
        for layer in kv.layers:
            codec.write(layer, torch.arange(a, b), k[a:b], k[a:b])
    usage = kv.usage()
    assert usage.resident_bytes == kivi_bytes(geom, bits, 4081)
    assert usage.staging_bytes == 8 * (2 * 16 * 3 * 64 * 2 + 24) * 2
    assert usage.capacity_bytes == 256 * codec.block_bytes(geom) + usage.staging_bytes
    # the default pool stages 16 sequences; a budget pays for its staging first
    n = num_blocks_for_budget(CODECS["kivi"](bits=bits), EMBEDDED, 256 << 20, torch.bfloat16)
    staged = CODECS["kivi"](bits=bits).staging_bytes(EMBEDDED, n)
    assert n * codec.block_bytes(EMBEDDED) + staged <= 256 << 20
    assert staged == 16 * 8 * (2 * 16 * 3 * 64 * 2 + 24) * 30
    # a budget too small for 16 sequences' rows still gets blocks, one row each at most
    few = num_blocks_for_budget(CODECS["kivi"](bits=bits), EMBEDDED, 8 << 20, torch.bfloat16)
    assert few >= 1 and few * codec.block_bytes(EMBEDDED) + CODECS["kivi"](
        bits=bits).staging_bytes(EMBEDDED, few) <= 8 << 20


def test_residual_zero_has_no_staging():
    codec = CODECS["kivi"](bits=2, residual=0)
    assert codec.staging_bytes(EMBEDDED, 100) == 0
    assert codec.resident_bytes(EMBEDDED, 4096) == 256 * codec.block_bytes(EMBEDDED)


def decode_two_sequences(codec, num_blocks=20, n=60, prefill=30):
    """Two sequences (blocks 0.. and 10..) prefilled in one call, then decoded one token
    each per call; returns the store and the exact K, V of each."""
    bs = GEOM.block_size
    store = codec.allocate(num_blocks, GEOM, "cpu", torch.float32)
    g = torch.Generator().manual_seed(1)
    kv = {s: (torch.randn(n, 2, 64, generator=g), torch.randn(n, 2, 64, generator=g))
          for s in (0, 10 * bs)}
    slots = torch.cat([torch.arange(prefill) + s for s in kv])
    codec.write(store, slots, torch.cat([k[:prefill] for k, _ in kv.values()]),
                torch.cat([v[:prefill] for _, v in kv.values()]))
    reads = []
    for t in range(prefill, n):
        codec.write(store, torch.tensor([s + t for s in kv]),
                    torch.stack([k[t] for k, _ in kv.values()]),
                    torch.stack([v[t] for _, v in kv.values()]))
        reads.append(read_all(codec, store, t + 1))
    return store, kv, reads


def read_all(codec, store, n):
    bs = GEOM.block_size
    nb = -(-n // bs)
    out = []
    for first in (0, 10):
        k, v = codec.read(store, torch.arange(first, first + nb))
        out.append((k.reshape(-1, 2, 64)[:n], v.reshape(-1, 2, 64)[:n]))
    return out


def test_small_pool_reads_what_a_never_evicting_pool_reads():
    """kivi(residual=20), bs 8: 2 sequences need 2 * 3 = 6 rows of 20 blocks. Every
    read equals the one of a pool of one row per block, bit for bit; the newest 13..20
    tokens of each sequence read back their exact K and V."""
    small = CODECS["kivi"](bits=2, residual=20, staging_seqs=2)
    every = CODECS["kivi"](bits=2, residual=20, staging_seqs=1000)
    store, kv, got = decode_two_sequences(small)
    assert store.state["staging"]["k"].shape[0] == 6
    _, _, want = decode_two_sequences(every)
    for step, (a, b) in enumerate(zip(got, want)):
        n = 30 + step + 1
        for (k_hat, v_hat), (k_ref, v_ref), (k, v) in zip(a, b, kv.values()):
            assert torch.equal(k_hat, k_ref) and torch.equal(v_hat, v_ref), step
            exact = [i for i in range(n) if torch.equal(k_hat[i], k[i])
                     and torch.equal(v_hat[i], v[i])]
            assert exact == list(range(exact[0], n)) and 13 <= n - exact[0] <= 20
            assert not torch.equal(k_hat[:exact[0]], k[:exact[0]])   # older: codes


def test_overflow_and_copies_fall_back_to_codes():
    """One sequence's worth of rows for two: the evicted blocks read their codes (within
    KIVI's bound), and a copy of a staged block never reads the rows after the source
    block is rewritten with other content."""
    codec = CODECS["kivi"](bits=4, residual=20, staging_seqs=1)
    store, kv, reads = decode_two_sequences(codec)
    for (k_hat, v_hat), (k, v) in zip(reads[-1], kv.values()):
        assert (k_hat - k).norm() / k.norm() < 0.1 and (v_hat - v).norm() / v.norm() < 0.1
    bs = GEOM.block_size
    last = 59 // bs                                            # partial, staged
    store.copy_blocks(torch.tensor([last]), torch.tensor([19]))
    k_copy, _ = codec.read(store, torch.tensor([19]))
    new = torch.randn(bs, 2, 64) * 100
    codec.write(store, torch.arange(last * bs, last * bs + bs), new, new)
    k_after, _ = codec.read(store, torch.tensor([19]))
    k_old = kv[0][0][last * bs:60]
    valid = 60 - last * bs
    assert torch.equal(k_copy[0, :valid], k_old)               # the copy was exact
    assert (k_after[0, :valid] - k_old).norm() / k_old.norm() < 0.1   # now its codes


@pytest.mark.parametrize("spec", ["kivi(bits=2,residual=8)", "kivi(bits=4,residual=12)"])
def test_greedy_tokens_match_a_never_evicting_pool(spec):
    from tests.conftest import make_tiny_llm, random_prompts
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = random_prompts([30, 45, 17, 60])
    small, every = (make_tiny_llm(kv=spec[:-1] + f",staging_seqs={n})") for n in (4, 10**6))
    got = [r.token_ids for r in small.generate(prompts, params)]
    want = [r.token_ids for r in every.generate(prompts, params)]
    assert got == want
    assert small.engine.kv.usage().staging_bytes == 0      # finished: no live block staged
    rows = small.engine.kv.layers[0].state["staging"]["k"].shape[0]
    assert rows == 4 * -(-int(spec.split("residual=")[1][:-1]) // 4) < 256
    assert small.engine.kv.staging_bytes < every.engine.kv.staging_bytes
    assert math.isclose(small.engine.kv.staging_bytes / every.engine.kv.staging_bytes,
                        rows / 256, rel_tol=1e-9)


@pytest.mark.parametrize("spec", ["kivi(bits=2,residual=8)",
                                  "kivi(bits=4,residual=8,staging_seqs=1)"])
def test_preemption_in_a_tight_pool_with_few_rows(spec):
    """24 blocks of 4 (rows capped at 24, or 2 for one staged sequence): sequences are
    preempted and recomputed, rows overflow and are all protected at times; every
    request completes, the pool is consistent, and no row is left to a live block."""
    from tests.conftest import make_tiny_llm, random_prompts
    tight = make_tiny_llm(kv=spec, num_blocks=24, block_size=4, max_num_batched_tokens=16)
    out = tight.generate(random_prompts([30, 25, 33, 28], seed=5),
                         SamplingParams(max_tokens=20, ignore_eos=True))
    assert [len(r.token_ids) for r in out] == [20] * 4
    assert tight.kv_usage()["num_preemptions"] > 0
    tight.engine.check_integrity()
    assert tight.kv_usage()["num_blocks_used"] == 0
    assert tight.engine.kv.usage().staging_bytes == 0
