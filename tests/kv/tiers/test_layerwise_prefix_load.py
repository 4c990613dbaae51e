"""Layer-wise prefix loads (``kv/offload/prefix_loads.py``, ``layer_loader.py``): an
admitted request's tier-held prefix is copied into the pool layer by layer while its
forward pass runs. Tokens and first-token logits equal the block-by-block fetch's and a
recompute's; the blocks hold exactly the frames' bytes afterwards; bad frames are misses
before any block is named; nothing that reads a block's content sees it half copied."""
from __future__ import annotations

import time

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.prefix import block_hashes
from kvmap.kv.tiers import serde
from kvmap.kv.offload.frames import FrameMismatch
from kvmap.kv.offload.layer_loader import FrameLayout, LayerLoad
from kvmap.kv.offload.prefix_loads import PREFIX_LOADS
from tests.conftest import make_tiny_llm, random_prompts

PREFIX, FLUSH, TAIL = random_prompts([41, 140, 7], seed=17)
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)
TIERS = {"host": "tiers(host=1MiB,fetch=always)",
         "disk": "tiers(disk=1MiB,disk_path=DIR,fetch=always)"}


def pushed_out(kv: str, mode: str, tmp_path=""):
    """A tiny LLM with ``prefix_load=mode`` whose PREFIX was served and then pushed out
    of the pool (all but its first 3 blocks) into the tier."""
    llm = make_tiny_llm(kv=kv.replace("DIR", str(tmp_path)), num_blocks=40, block_size=4,
                        max_num_batched_tokens=64)
    llm.engine.offload.store.loads.prefix_load = mode
    llm.generate([PREFIX], GREEDY)
    llm.generate([FLUSH], GREEDY)          # the pool reuses its blocks: PREFIX in the tier
    return llm


def serve_from_tier(kv: str, mode: str, tmp_path):
    """PREFIX + TAIL admitted at once (no read-ahead) after ``pushed_out``:
    (llm, request)."""
    llm = pushed_out(kv, mode, tmp_path)
    req = llm.engine.add_request(PREFIX + TAIL, GREEDY)
    while llm.engine.has_unfinished():
        llm.engine.step()
    return llm, req


@pytest.mark.parametrize("codec", ["fp32", "int8"])
@pytest.mark.parametrize("tier", sorted(TIERS))
def test_layerwise_equals_block_by_block_and_recompute(tier, codec, tmp_path):
    kv = f"{codec}+{TIERS[tier]}"
    outs = {}
    for mode in PREFIX_LOADS:
        llm, req = serve_from_tier(kv, mode, tmp_path / mode)
        stats = llm.engine.offload.store.stats
        assert req.metrics.num_cached_prompt_tokens == (len(PREFIX) // 4) * 4
        assert stats.num_promoted_blocks >= len(PREFIX) // 4 - 3   # 3 left in the pool
        assert (stats.num_layerwise_blocks > 0) == (mode != "per-block")
        assert not llm.engine.offload.store.loads.loader.pending       # finished with the step
        outs[mode] = req.output_token_ids
        llm.engine.check_integrity()
        llm.engine.close()
    fresh = make_tiny_llm(kv=codec, enable_prefix_caching=False, block_size=4)
    expected = fresh.generate([PREFIX + TAIL], GREEDY)[0].token_ids
    assert outs == {mode: expected for mode in PREFIX_LOADS}


def test_layerwise_blocks_hold_the_frames_bytes_and_logits_equal():
    """First-token logits bit-equal to the block-by-block fetch's, and every fetched
    block's tensors equal to its frame in the tier."""
    logits, blocks = {}, {}
    for mode in ("layerwise", "per-block"):
        engine = pushed_out("int8+tiers(host=1MiB,fetch=always)", mode).engine
        logits[mode] = engine.score(PREFIX + TAIL, len(PREFIX) + 1)
        store = engine.offload.store
        assert (store.stats.num_layerwise_blocks > 0) == (mode == "layerwise")
        hashes = [h for h in store.kv.pool.hash_to_block if store.levels[0].tier.contains(h)]
        blocks[mode] = {}
        for h in hashes:
            frame = serde.decode_block(store.levels[0].tier.get(h))
            block_id = store.kv.pool.hash_to_block[h]
            for layer, tensors in zip(store.kv.layers, frame):
                for name, t in tensors.items():
                    assert torch.equal(layer.blocks[name][block_id], t), (mode, name)
            blocks[mode][h] = block_id
        assert len(blocks[mode]) >= len(PREFIX) // 4 - 3
        engine.close()
    assert torch.equal(logits["layerwise"], logits["per-block"])


def test_a_batch_with_another_request_waits_per_layer():
    """A decode of another request and the fetched prefix share one forward pass."""
    llm = pushed_out("fp32+tiers(host=1MiB,fetch=always)", "layerwise")
    engine = llm.engine
    other = engine.add_request(TAIL * 3, SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    req = engine.add_request(PREFIX + TAIL, GREEDY)
    engine.step()                                  # admitted, loaded during this step
    assert engine.offload.store.stats.num_layerwise_loads == 1
    while engine.has_unfinished():
        engine.step()
    fresh = make_tiny_llm(kv="fp32", enable_prefix_caching=False, block_size=4)
    a, b = fresh.generate([PREFIX + TAIL, TAIL * 3], [GREEDY, SamplingParams(
        max_tokens=8, ignore_eos=True)])
    assert req.output_token_ids == a.token_ids and other.output_token_ids == b.token_ids
    assert engine.offload.store.stats.layerwise_copy_s > 0
    engine.check_integrity()
    engine.close()


def test_a_corrupt_frame_is_a_miss_and_the_rest_is_recomputed():
    llm = pushed_out("fp32+tiers(host=1MiB,fetch=always)", "layerwise")
    engine = llm.engine
    tier, pool = engine.offload.levels[0].tier, engine.kv.pool
    hashes = block_hashes(PREFIX, 4, engine.scheduler.prefix_salt)
    first_tier = next(i for i, h in enumerate(hashes) if h not in pool.hash_to_block)
    bad = hashes[first_tier + 2]
    data = bytearray(tier._data[bad])
    data[-1] ^= 0xFF                                       # its last tensor byte
    tier._data[bad] = bytes(data)
    req = engine.add_request(PREFIX + TAIL, GREEDY)
    while engine.has_unfinished():
        engine.step()
    assert req.metrics.num_cached_prompt_tokens == (first_tier + 2) * 4
    assert engine.offload.store.stats.errors["corrupt"] == 1 and not tier.contains(bad)
    assert engine.offload.store.stats.num_layerwise_blocks == 2
    fresh = make_tiny_llm(kv="fp32", enable_prefix_caching=False, block_size=4)
    assert req.output_token_ids == fresh.generate([PREFIX + TAIL], GREEDY)[0].token_ids
    engine.check_integrity()
    engine.close()


def test_frame_layout_refuses_another_layout_and_a_flipped_bit():
    llm = make_tiny_llm(kv="int8+tiers(host=1MiB)", num_blocks=8, block_size=4)
    store = llm.engine.offload.store
    layout = store.loads.layout
    frame = store.frames.encode_pool_block(3, store.kv.codec)
    layout.check(frame)
    flipped = bytearray(frame)
    flipped[len(frame) // 2] ^= 1
    with pytest.raises(serde.CorruptBlockError):
        layout.check(bytes(flipped))
    other = make_tiny_llm(kv="fp32+tiers(host=1MiB)", num_blocks=8, block_size=4)
    with pytest.raises(FrameMismatch):
        layout.check(other.engine.offload.store.frames.encode_pool_block(0, other.engine.kv.codec))
    # an intact frame of the same length whose first tensor has another name
    renamed = serde.encode_block([[("k.x" if n == "k.q" else n, t)
                                   for n, t in layer.block_to_bytes(3)]
                                  for layer in store.kv.layers])
    assert len(renamed) == len(frame)
    with pytest.raises(FrameMismatch):
        layout.check(renamed)
    assert FrameLayout(frame).layer_ranges == layout.layer_ranges
    with pytest.raises(ValueError, match="prefix_load='sync'; choose one of layerwise"):
        store.loads.prefix_load = "sync"
    store.close()
    other.engine.close()


def test_demotion_finishes_a_pending_load_only_for_its_blocks():
    """A block named but still being copied in is never written down a tier half
    copied: demoting it waits for the load; demoting another block does not."""
    llm = pushed_out("fp32+tiers(host=1MiB,fetch=always)", "layerwise")
    engine = llm.engine
    loader, pool = engine.offload.store.loads.loader, engine.kv.pool
    taken = engine.offload.store.take_prefix(block_hashes(PREFIX, 4, engine.scheduler.prefix_salt),
                                     0, layerwise=True)
    loading = [b for b in taken if loader.loading(b)]
    assert loader.pending and 0 < len(loading) < len(taken)   # some came from the pool
    other = next(b for b in taken if b not in loading)
    engine.offload.store.demote(other, pool.block_hash[other], "host")
    assert loader.pending
    h = pool.block_hash[loading[0]]
    frame = engine.offload.levels[0].tier.get(h)
    engine.offload.levels[0].tier.delete(h)
    engine.offload.store.demote(loading[0], h, "host")               # re-encodes the pool block
    assert not loader.pending and engine.offload.levels[0].tier.get(h) == frame
    pool.free(taken)
    engine.check_integrity()
    engine.close()


def test_attention_waits_for_a_slow_load(monkeypatch):
    """With every layer's copy delayed, the forward pass still reads each layer only
    once it is copied: first-token logits equal the block-by-block fetch's."""
    slow = LayerLoad._copy_layer

    def delayed(self, *args):
        time.sleep(0.02)
        slow(self, *args)
    monkeypatch.setattr(LayerLoad, "_copy_layer", delayed)
    logits = {}
    for mode in ("layerwise", "per-block"):
        engine = pushed_out("fp32+tiers(host=1MiB,fetch=always)", mode).engine
        logits[mode] = engine.score(PREFIX + TAIL, len(PREFIX) + 1)
        if mode == "layerwise":
            assert engine.offload.store.stats.layerwise_wait_s > 0        # it did wait
        engine.close()
    assert torch.equal(logits["layerwise"], logits["per-block"])


def test_a_level_in_another_codec_is_copied_block_by_block(tmp_path):
    """Blocks that reach a disk level of another codec (int4) are decoded and copied at
    admission, the rest loaded layer by layer: the same tokens as the per-block fetch,
    no frame counted bad."""
    kv = "fp32+tiers(host=12KiB,disk=1MiB,disk_path=DIR,disk_codec=int4,fetch=always)"
    outs = {}
    for mode in ("layerwise", "per-block"):
        llm, req = serve_from_tier(kv, mode, tmp_path / mode)
        stats = llm.engine.offload.store.stats
        assert req.metrics.num_cached_prompt_tokens == (len(PREFIX) // 4) * 4
        assert not stats.errors and llm.kv_usage()["tiers"]["disk"]["num_hits"] > 0
        if mode == "layerwise":      # some blocks from each level
            assert 0 < stats.num_layerwise_blocks < stats.num_promoted_blocks
        outs[mode] = req.output_token_ids
        llm.engine.check_integrity()
        llm.engine.close()
    assert outs["layerwise"] == outs["per-block"]


def test_a_failed_copy_raises_and_its_blocks_are_not_reused(monkeypatch):
    """A copy that raises (a bug: bad frames are refused at admission) fails the step
    and leaves no block named by a hash it does not hold."""
    def broken(self, *args):
        raise RuntimeError("copy failed")
    monkeypatch.setattr(LayerLoad, "_copy_layer", broken)
    llm = pushed_out("fp32+tiers(host=1MiB,fetch=always)", "layerwise")
    engine = llm.engine
    req = engine.add_request(PREFIX + TAIL, GREEDY)
    with pytest.raises(RuntimeError, match="copy failed"):
        engine.step()
    pool, stats = engine.kv.pool, engine.offload.store.stats
    hashes = block_hashes(PREFIX, 4, engine.scheduler.prefix_salt)
    first_tier = req.metrics.num_cached_prompt_tokens // 4 - stats.num_layerwise_blocks
    assert stats.num_layerwise_blocks > 0 and first_tier == 3
    assert all(h in pool.hash_to_block for h in hashes[:first_tier])   # from the pool
    assert all(h not in pool.hash_to_block for h in hashes[first_tier:])
    assert not engine.offload.store.loads.loader.pending
    engine.close()
