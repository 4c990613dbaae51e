"""Paging a context larger than the pool through the tiers (`kv/offload/pager.py`):
attention over resident and paged-out keys merged by log-sum-exp equals dense attention;
greedy tokens and logits with paging equal those of an un-paged run with a big pool, for
every prefetch mode and a host+disk chain; counters add up; lost or corrupt pages are
recomputed (or the request aborted), never turned into wrong tokens."""
from __future__ import annotations

import re

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.codecs import CODECS
from kvmap.kv.offload.decisions import OffloadStep
from kvmap.kv.spec import KVGeometry
from kvmap.model.attention import AttentionMetadata, PrefillSegment, paged_attention
from kvmap.model.shapes import get_shape
from tests.conftest import make_tiny_llm, random_prompts

TINY = get_shape("tiny")
BS = 4                     # tokens per block
POOL = 12                  # pool blocks: 48 tokens, the prompt below is 90
CHUNK = 16                 # prefill chunk (step budget)
PROMPT = random_prompts([90], seed=3)[0]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def paged_llm(spec: str = "tiers(host=1MiB,prefetch=window,page_blocks=2)", **kwargs):
    return make_tiny_llm(kv="fp32+" + spec, num_blocks=POOL, block_size=BS,
                         max_num_batched_tokens=CHUNK, **kwargs)


@pytest.fixture(scope="module")
def reference():
    """The un-paged run: same model and codec, a pool that holds everything."""
    llm = make_tiny_llm(num_blocks=256, block_size=BS, max_num_batched_tokens=CHUNK,
                        enable_prefix_caching=False)   # score() computes every token
    out = llm.generate([PROMPT], GREEDY)[0]
    logits = llm.engine.score(PROMPT + out.token_ids)
    return out.token_ids, logits


def paging(llm) -> dict:
    return llm.kv_usage()["tier_store"]["paging"]


# ---- attention: resident part + paged-out part, merged ------------------------------------
class FakeContext:
    """An OffloadedContext over given K/V (tokens, H, D)."""

    def __init__(self, k, v, page_tokens):
        self.k, self.v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
        self.page_tokens = page_tokens
        self.masses = {}

    def layer_kv(self, layer):
        return self.k, self.v

    def observe(self, layer, mass):
        self.masses[layer] = mass


@pytest.mark.parametrize("chunk", [1, 5])       # a decode step; a prefill chunk
def test_attention_over_resident_and_offloaded_keys_equals_dense(chunk):
    g = torch.Generator().manual_seed(0)
    geom = KVGeometry.of(TINY, block_size=BS)
    H, D, Hq = geom.num_kv_heads, geom.head_dim, TINY.num_heads
    codec = CODECS["fp32"]()
    num_keys, off_blocks = 30, 4                  # 16 keys paged out, 14 resident
    k_all = torch.randn(num_keys, H, D, generator=g)
    v_all = torch.randn(num_keys, H, D, generator=g)
    q = torch.randn(chunk, Hq, D, generator=g)
    new = num_keys - chunk                        # the chunk's own keys are the last ones

    def run(first_key, ctx):
        store = codec.allocate(16, geom, "cpu", torch.float32)
        n_old = new - first_key
        old_blocks = -(-n_old // BS) if n_old else 0
        slots = torch.arange(n_old)
        codec.write(store, slots, k_all[first_key:new], v_all[first_key:new])
        n_total = num_keys - first_key
        table = list(range(-(-n_total // BS)))
        assert len(table) >= old_blocks
        new_slots = torch.arange(n_old, n_total)
        if chunk == 1:
            meta = AttentionMetadata.build(new_slots, [table], [n_total], [], BS, "cpu")
            if ctx is not None:
                meta.offload = OffloadStep(decode={0: ctx})
        else:
            seg = PrefillSegment(0, chunk, torch.tensor(table), n_total)
            meta = AttentionMetadata.build(new_slots, [], [], [seg], BS, "cpu")
            if ctx is not None:
                meta.offload = OffloadStep(prefill={0: ctx})
        return paged_attention(q, k_all[new:], v_all[new:], store, codec, meta, H)

    dense = run(0, None)
    off = off_blocks * BS
    ctx = FakeContext(k_all[:off], v_all[:off], page_tokens=2 * BS)
    paged = run(off, ctx)
    torch.testing.assert_close(paged, dense, atol=1e-5, rtol=1e-5)
    mass = ctx.masses[0]
    assert mass.shape == (2,) and bool((mass > 0).all())
    # without the paged-out part the answer is different: the test can fail
    assert not torch.allclose(run(off, None), dense, atol=1e-3)


# ---- the engine: paged == un-paged -------------------------------------------------------
PAGED_SPECS = [
    "tiers(host=1MiB,prefetch=none,page_blocks=2)",
    "tiers(host=1MiB,prefetch=window,page_blocks=2)",
    "tiers(host=1MiB,prefetch=window,page_blocks=1,prefetch_depth=1)",
    "tiers(host=1MiB,prefetch=attention,page_blocks=2)",
    "tiers(host=1MiB,prefetch=attention,page_blocks=2,prefetch_pages=2)",
    "tiers(host=6KiB,disk=1MiB,disk_path=DIR,prefetch=window,page_blocks=2)",
]
# every prefetch order (tests/test_family_rows.py)
PREFETCH_ROWS = sorted({re.search(r"prefetch=(\w+)", spec).group(1) for spec in PAGED_SPECS})


@pytest.mark.parametrize("spec", PAGED_SPECS)
def test_paged_greedy_tokens_and_logits_equal_unpaged(spec, reference, tmp_path):
    ref_tokens, ref_logits = reference
    llm = paged_llm(spec.replace("DIR", str(tmp_path)))
    out = llm.generate([PROMPT], GREEDY)[0]
    assert out.token_ids == ref_tokens
    p = paging(llm)
    assert p["num_pages_out"] > 0 and p["num_frames_read"] > 0 and p["num_page_faults"] == 0
    if "prefetch=none" in spec:
        assert p["num_prefetch_hits"] == 0 and p["num_sync_reads"] == p["num_frames_read"]
    elif "prefetch_pages" in spec:
        assert p["num_prefetch_hits"] > 0 and p["num_sync_reads"] > 0
    else:
        assert p["num_prefetch_hits"] > 0
    # teacher-forced logits of prompt + answer, paged in prefill chunks
    logits = llm.engine.score(PROMPT + out.token_ids)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    if "disk" in spec:
        assert llm.kv_usage()["tiers"]["disk"]["num_hits"] > 0   # pages read from disk
    llm.engine.check_integrity()
    llm.engine.close()


def test_counters_add_up_and_pages_are_deleted_after():
    llm = paged_llm("tiers(host=1MiB,prefetch=window,page_blocks=2)")
    llm.generate([PROMPT], GREEDY)
    usage = llm.kv_usage()
    p, host = usage["tier_store"]["paging"], usage["tiers"]["host"]
    num_layers = TINY.num_layers
    assert p["num_frames_written"] == p["num_pages_out"] * num_layers
    assert p["bytes_written"] == p["num_frames_written"] * p["frame_bytes"]["host"]
    assert host["bytes_written"] == p["bytes_written"]          # bytes out = bytes in
    assert p["bytes_read"] == p["num_frames_read"] * p["frame_bytes"]["host"]
    # every frame the host gave was used by attention or read ahead in vain
    assert host["bytes_read"] == p["bytes_read"] + p["num_wasted_prefetches"] * \
        p["frame_bytes"]["host"]
    assert p["num_frames_read"] == p["num_prefetch_hits"] + p["num_sync_reads"]
    assert host["num_hits"] == p["num_frames_read"] + p["num_wasted_prefetches"]
    assert not any(k.startswith("page/") for k in llm.engine.offload.levels[0].tier.keys())
    assert usage["num_blocks_used"] == 0
    llm.engine.check_integrity()
    llm.engine.close()


def test_prompt_larger_than_pool_needs_tiers():
    with pytest.raises(ValueError, match="add tiers"):
        make_tiny_llm(num_blocks=POOL, block_size=BS).generate([PROMPT], GREEDY)


def test_pool_too_small_to_page_is_refused_naming_the_need():
    llm = make_tiny_llm(kv="fp32+tiers(host=1MiB,page_blocks=4)", num_blocks=6,
                        block_size=BS, max_num_batched_tokens=CHUNK)
    with pytest.raises(ValueError, match="needs a pool of at least 9"):
        llm.generate([PROMPT], GREEDY)
    llm.engine.close()


def test_long_and_short_requests_together(reference):
    """A paged request among others: everyone finishes with the un-paged tokens."""
    short = random_prompts([9, 13], seed=11)
    plain = make_tiny_llm(num_blocks=256, block_size=BS, max_num_batched_tokens=CHUNK)
    expected = [o.token_ids for o in plain.generate(short, GREEDY)]
    llm = paged_llm()
    outs = llm.generate([short[0], PROMPT, short[1]], GREEDY)
    assert [o.token_ids for o in outs] == [expected[0], reference[0], expected[1]]
    llm.engine.check_integrity()
    llm.engine.close()


def test_per_level_codec_applies_to_pages(tmp_path):
    """Pages that move from an fp32 host to an int8 disk are re-encoded per layer."""
    llm = paged_llm(f"tiers(host=6KiB,disk=1MiB,disk_path={tmp_path},disk_codec=int8,"
                    "prefetch=window,page_blocks=2)")
    out = llm.generate([PROMPT], GREEDY)[0]
    usage = llm.kv_usage()
    assert len(out.token_ids) == GREEDY.max_tokens and out.finish_reason == "length"
    assert usage["tiers"]["disk"]["num_hits"] > 0
    assert usage["tier_store"]["errors"] == {} and usage["tier_store"]["paging"]["errors"] == {}
    llm.engine.close()


# ---- faults --------------------------------------------------------------------------------
def run_with_fault(llm, fault, after_steps=12):
    """Generate PROMPT, calling ``fault(llm)`` once after ``after_steps`` steps."""
    engine = llm.engine
    req = engine.add_request(PROMPT, GREEDY)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps == after_steps:
            fault(llm)
    return engine.pop_finished(req.request_id)


def page_keys(llm):
    return [k for lv in llm.engine.offload.levels for k in lv.tier.keys()
            if isinstance(k, str) and k.startswith("page/")]


def corrupt_host_pages(llm):
    host = llm.engine.offload.levels[0].tier
    keys = page_keys(llm)
    assert keys
    for key in keys:
        data = bytearray(host._data[key])
        data[-1] ^= 0xFF
        host._data[key] = bytes(data)


def delete_pages(llm):
    keys = page_keys(llm)
    assert keys
    for key in keys:
        llm.engine.offload.levels[0].tier.delete(key)


def corrupt_disk_files(llm):
    disk = llm.engine.offload.levels[-1].tier
    keys = [k for k in disk.keys() if k.startswith("page/")]
    assert keys
    for key in keys:
        path = disk.path_of(key)
        path.write_bytes(path.read_bytes()[:-7])        # truncated


@pytest.mark.parametrize("fault,spec", [
    (corrupt_host_pages, "tiers(host=1MiB,prefetch=window,page_blocks=2)"),
    (delete_pages, "tiers(host=1MiB,prefetch=none,page_blocks=2)"),
    (corrupt_disk_files, "tiers(host=6KiB,disk=1MiB,disk_path=DIR,prefetch=window,page_blocks=2)"),
])
def test_lost_or_corrupt_pages_are_recomputed(fault, spec, reference, tmp_path):
    llm = paged_llm(spec.replace("DIR", str(tmp_path)))
    out = run_with_fault(llm, fault)
    assert out.token_ids == reference[0] and out.finish_reason == "length"
    p = paging(llm)
    assert p["num_page_faults"] >= 1 and p["errors"]
    assert llm.kv_usage()["num_preemptions"] >= 1
    llm.engine.check_integrity()
    llm.engine.close()


def test_tiers_too_small_for_the_pages_abort_not_wrong_tokens():
    """The host holds only a few pages and nothing is below it: pages fall off the
    bottom, every retry faults again, and the request ends aborted after a few tries."""
    llm = paged_llm("tiers(host=8KiB,prefetch=window,page_blocks=2)")
    out = llm.generate([PROMPT], GREEDY)[0]
    assert out.finish_reason == "abort"
    assert paging(llm)["num_page_faults"] == 3
    llm.engine.check_integrity()
    llm.engine.close()


def run_together(llm, prompts):
    """Run ``prompts`` at once, checking the pool after every step; returns the requests
    and the most of them paged at the same time."""
    engine, pager = llm.engine, llm.engine.offload.pager
    reqs = [engine.add_request(p, GREEDY) for p in prompts]
    most_paged = 0
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()
        most_paged = max(most_paged, sum(pager.is_paged(r.request_id) for r in reqs if not r.status.finished))
    return reqs, most_paged


def test_two_sequences_paged_at_once_give_the_tokens_of_one_at_a_time():
    """Two prompts, each larger than the pool, run together: both are paged at once
    (no longer refused) and each gives the tokens it gives alone, with no page left."""
    prompts = [PROMPT, random_prompts([80], seed=4)[0]]
    alone = [paged_llm().generate([p], GREEDY)[0].token_ids for p in prompts]
    llm = make_tiny_llm(kv="fp32+tiers(host=1MiB,prefetch=window,page_blocks=2)",
                        num_blocks=16, block_size=BS, max_num_batched_tokens=CHUNK)
    reqs, most_paged = run_together(llm, prompts)
    assert most_paged == 2
    assert [r.output_token_ids for r in reqs] == alone
    assert llm.engine.offload.pager.seqs == {} and paging(llm)["num_page_faults"] == 0


@pytest.mark.parametrize("pool_blocks, page_blocks", [(16, 4), (20, 4), (24, 8)])
def test_a_running_sequence_short_of_blocks_pages_the_others_before_preempting(
        pool_blocks, page_blocks):
    """Pages of several blocks and a chunk of half the pool (the real model's shape: 16
    of 64 blocks, chunks of 32): the second sequence, short of blocks at its next chunk
    once its own front is out, pages the first one's front instead of being preempted
    (and recomputed, again and again, until the first one finished)."""
    prompts = random_prompts([128, 128], seed=5)
    chunk = pool_blocks // 2 * BS
    spec = f"fp32+tiers(host=4MiB,prefetch=window,page_blocks={page_blocks})"
    alone = [make_tiny_llm(kv=spec, num_blocks=pool_blocks, block_size=BS,
                           max_num_batched_tokens=chunk).generate([p], GREEDY)[0].token_ids
             for p in prompts]
    llm = make_tiny_llm(kv=spec, num_blocks=pool_blocks, block_size=BS,
                        max_num_batched_tokens=chunk)
    reqs, most_paged = run_together(llm, prompts)
    assert [r.metrics.num_preemptions for r in reqs] == [0, 0]
    assert most_paged == 2
    assert [r.output_token_ids for r in reqs] == alone
