"""The tiered store: the `tiers(...)` spec part, demotion and promotion between the pool
and the tiers (bit-exact, per-tier codecs, faults), the cost model, and the engine with
tiers: greedy tokens equal those of `recompute` for every tier and eviction order, and a
run survives Redis dying, stalling or filling up."""
from __future__ import annotations

import errno
import re

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.cache import PagedKVCache
from kvmap.kv.codecs import CODECS
from kvmap.kv.config import KVConfig
from kvmap.kv.prefix import block_hashes, prefix_salt
from kvmap.kv.spec import KVGeometry
from kvmap.kv.tiers import disk as disk_module
from kvmap.kv.offload.cost import CostModel, prefill_flops
from kvmap.kv.tiers.eviction import EVICTION_ORDERS
from kvmap.kv.offload.store import TieredStore
from kvmap.model.shapes import get_shape
from tests.conftest import make_tiny_llm, random_prompts

TINY = get_shape("tiny")
GEOM = KVGeometry.of(TINY, block_size=4)


# ---- the spec part ------------------------------------------------------------------------
def test_tiers_part_parses_levels_top_down():
    layout = KVConfig.parse("int8+tiers(redis=redis://h:1/0, disk=2MiB, host=1MiB, "
                            "disk_codec=int4, evict=arc)").tiers
    assert [lv.name for lv in layout.levels] == ["host", "disk", "redis"]
    assert [lv.capacity_bytes for lv in layout.levels] == [2**20, 2 * 2**20, 2**30]
    assert layout.levels[1].codec.name == "int4" and layout.levels[0].codec is None
    assert layout.levels[2].backend_options == {"url": "redis://h:1/0"}
    assert KVConfig.parse("bf16+recompute").tiers.levels == ()


@pytest.mark.parametrize("spec,fragment", [
    ("tiers()", "at least one of host="),
    ("tiers(host=0)", "host=0"),
    ("tiers(host=lots)", "host='lots'"),
    ("tiers(host=1MiB,evict=fifo)", "evict='fifo'"),
    ("tiers(host=1MiB,prefetch=sometimes)", "prefetch='sometimes'"),
    ("tiers(host=1MiB,page_blocks=0)", "page_blocks=0 must be an integer >= 1"),
    ("tiers(host=1MiB,prefetch_pages=two)", "prefetch_pages='two'"),
    ("tiers(host=1MiB,fetch=never)", "fetch='never'"),
    ("tiers(host=1MiB,disk_path=/tmp/x)", "disk_path=/tmp/x is given without disk="),
    ("tiers(host=1MiB,redis_size=1MiB)", "redis_size=1MiB is given without redis="),
    ("tiers(host=1MiB,disk_codec=int4)", "disk_codec=int4 is given without disk="),
    ("tiers(host=1MiB,host_codec=int5)", "host_codec=int5 is not a codec"),
    ("tiers(host=1MiB,host_codec=int4(bits=3))", "host_codec=int4(bits=3)"),
    ("tiers(redis=localhost:6379)", "redis='localhost:6379'"),
    ("tiers(hosts=1MiB)", "no option 'hosts'"),
    ("recompute(host=1MiB)", "no option 'host'"),
])
def test_bad_tier_options_raise_naming_them(spec, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        KVConfig.parse("bf16+" + spec)


# ---- the store on a bare cache ----------------------------------------------------------------
def make_cache(num_blocks=4, codec="fp32") -> PagedKVCache:
    return PagedKVCache(CODECS[codec](), GEOM, num_blocks, "cpu", torch.float32)


def make_store(kv, spec: str, tmp_path=None) -> TieredStore:
    if tmp_path is not None:
        spec = spec.replace("DIR", str(tmp_path))
    store = TieredStore(KVConfig.parse("fp32+" + spec).tiers, kv, TINY)
    return store


def fill_and_cache(kv: PagedKVCache, num_blocks: int, seed: int = 0):
    """Allocate blocks, fill every layer with random K/V, name them by hash, free them.
    Returns (hashes, {name: per-layer copies of each block's tensors})."""
    g = torch.Generator().manual_seed(seed)
    bs = kv.block_size
    tokens = torch.randint(0, 256, (num_blocks * bs + 1,), generator=g).tolist()
    hashes = block_hashes(tokens, bs, prefix_salt("tiny", "fp32", "fp32"))[:num_blocks]
    ids = kv.pool.allocate(num_blocks)
    for layer in kv.layers:
        for b in ids:
            slots = b * bs + torch.arange(bs)
            k = torch.randn(bs, GEOM.num_kv_heads, GEOM.head_dim, generator=g)
            kv.codec.write(layer, slots, k, torch.randn(k.shape, generator=g))
    for b, h in zip(ids, hashes):
        kv.pool.register_hash(b, h)
    saved = [[{n: t.clone() for n, t in layer.block_to_bytes(b)} for layer in kv.layers]
             for b in ids]
    kv.pool.free(ids)
    return hashes, saved


def block_tensors(kv, block_id):
    return [{n: t.clone() for n, t in layer.block_to_bytes(block_id)} for layer in kv.layers]


def equal_bits(a, b) -> bool:
    return all(torch.equal(x[n].view(torch.uint8), y[n].view(torch.uint8))
               for x, y in zip(a, b) for n in x)


def evict_all(kv):
    """Reallocate every block (demoting every cached one), then free them uncached."""
    ids = kv.pool.allocate(kv.pool.num_free)
    kv.pool.free(ids)


TIER_SPECS = {
    "host": "tiers(host=1MiB,evict={e},fetch=always)",
    "disk": "tiers(disk=1MiB,disk_path=DIR,evict={e},fetch=always)",
    "redis": "tiers(redis={url},evict={e},fetch=always)",
    "host+disk": "tiers(host=5KiB,disk=1MiB,disk_path=DIR,evict={e},fetch=always)",
}
TIER_KINDS = ["host", "disk", pytest.param("redis", marks=pytest.mark.redis), "host+disk"]


def tier_spec(kind, eviction, request, capacity=None) -> str:
    url = request.getfixturevalue("redis_url") if kind == "redis" else ""
    spec = TIER_SPECS[kind].format(e=eviction, url=url)
    if kind == "disk" or kind == "host+disk":
        spec = spec.replace("DIR", str(request.getfixturevalue("tmp_path")))
    if capacity is not None:
        spec = spec.replace("1MiB", capacity)
        if kind == "redis":
            spec = spec.replace(")", f",redis_size={capacity})")
    return spec


@pytest.mark.parametrize("eviction", EVICTION_ORDERS)
@pytest.mark.parametrize("kind", TIER_KINDS)
def test_demoted_blocks_come_back_bit_exact(kind, eviction, request):
    kv = make_cache(num_blocks=4)
    store = make_store(kv, tier_spec(kind, eviction, request))
    request.addfinalizer(store.close)
    hashes, saved = fill_and_cache(kv, 4)
    evict_all(kv)                                       # all four leave the pool
    assert store.stats.num_demoted_blocks == 4 and kv.pool.hash_to_block == {}
    taken = store.take_prefix(hashes, 0)
    assert len(taken) == 4 and store.stats.num_promoted_blocks == 4
    assert all(equal_bits(block_tensors(kv, b), s) for b, s in zip(taken, saved))
    assert [kv.pool.block_hash[b] for b in taken] == hashes     # registered: pool hits next
    kv.pool.check_integrity([taken])
    store.check_integrity()
    usage = store.usage()
    assert sum(u["num_hits"] for u in usage.values()) == 4
    if kind == "host+disk":                             # 5 KiB holds two 2.2 KB frames
        assert usage["host"]["num_evictions"] == 2 and usage["disk"]["num_hits"] == 2


def test_pool_hook_sees_only_cached_blocks_and_keeps_the_pool_consistent():
    kv = make_cache(num_blocks=4)
    seen = []
    kv.pool.on_evict = lambda block_id, h: (seen.append((block_id, h)),
                                            kv.pool.check_integrity())
    hashes, _ = fill_and_cache(kv, 2)
    kv.pool.allocate(4)
    assert sorted(h for _, h in seen) == sorted(hashes)


def test_the_pool_keeps_serving_its_own_blocks_between_tier_blocks(tmp_path):
    kv = make_cache(num_blocks=6)
    store = make_store(kv, "tiers(host=1MiB,fetch=always)")
    hashes, saved = fill_and_cache(kv, 3)
    evict_all(kv)
    # block 1 comes back into the pool by itself; blocks 0 and 2 stay in the host tier
    got = store.take_prefix(hashes[:2], 1)
    kv.pool.free(got)
    taken = store.take_prefix(hashes, 0)
    assert taken[1] == got[0] and len(taken) == 3
    assert all(equal_bits(block_tensors(kv, b), s) for b, s in zip(taken, saved))
    store.close()


@pytest.mark.parametrize("tier_codec", ["int8", "int4"])
def test_a_cheaper_disk_codec_is_applied_on_the_way_down(tmp_path, tier_codec):
    kv = make_cache(num_blocks=4)
    store = make_store(kv, f"tiers(host=3KiB,disk=1MiB,disk_path={tmp_path},"
                           f"disk_codec={tier_codec},fetch=always)")
    hashes, saved = fill_and_cache(kv, 4)
    evict_all(kv)
    usage = store.usage()
    assert usage["disk"]["codec"] == tier_codec and usage["disk"]["num_blocks"] == 3
    assert usage["disk"]["frame_bytes"] < usage["host"]["frame_bytes"]
    on_host = [store.levels[0].tier.contains(h) for h in hashes]
    assert sum(on_host) == 1                 # the last one demoted
    taken = store.take_prefix(hashes, 0)
    assert len(taken) == 4
    codec = CODECS[tier_codec]()
    for b, s, exact in zip(taken, saved, on_host):
        got = block_tensors(kv, b)
        if exact:
            assert equal_bits(got, s)
            continue
        for layer, (g, orig) in enumerate(zip(got, s)):
            # expected: the original through the tier codec and back
            scratch = codec.allocate(1, GEOM, "cpu", torch.float32, layer_id=layer)
            codec.write(scratch, torch.arange(4), orig["k"], orig["v"])
            k, v = codec.read(scratch, torch.zeros(1, dtype=torch.long))
            assert torch.equal(g["k"], k[0]) and torch.equal(g["v"], v[0])
            assert not torch.equal(g["k"], orig["k"])
            assert (g["k"] - orig["k"]).abs().max() < (0.05 if tier_codec == "int8" else 0.6)
    store.close()


# ---- faults: a miss, counted; the rest is recomputed ----------------------------------------
def test_a_corrupted_disk_block_is_detected_and_the_chain_stops_there(tmp_path):
    kv = make_cache(num_blocks=4)
    store = make_store(kv, f"tiers(disk=1MiB,disk_path={tmp_path},fetch=always)")
    hashes, saved = fill_and_cache(kv, 4)
    evict_all(kv)
    disk = store.levels[0].tier
    path = disk.path_of(hashes[2])
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    taken = store.take_prefix(hashes, 0)
    assert len(taken) == 2 and all(equal_bits(block_tensors(kv, b), s)
                                   for b, s in zip(taken, saved))
    assert disk.stats.errors["corrupt"] == 1 and not disk.contains(hashes[2])
    assert store.stats.num_recomputed_tokens == 2 * kv.block_size
    kv.pool.check_integrity([taken])
    store.close()


def test_a_checksum_mismatch_in_host_memory_is_caught_by_the_store():
    kv = make_cache(num_blocks=4)
    store = make_store(kv, "tiers(host=1MiB,fetch=always)")
    hashes, _ = fill_and_cache(kv, 2)
    evict_all(kv)
    host = store.levels[0].tier
    raw = bytearray(host._data[hashes[0]])
    raw[-1] ^= 0x80
    host._data[hashes[0]] = bytes(raw)
    assert store.take_prefix(hashes, 0) == []
    assert store.stats.errors["corrupt"] == 1 and not host.contains(hashes[0])
    assert kv.pool.num_free == 4                        # nothing allocated for it
    store.close()


def test_a_frame_of_another_layout_is_a_mismatch_not_a_crash():
    kv = make_cache(num_blocks=4)
    store = make_store(kv, "tiers(host=1MiB,fetch=always)")
    from kvmap.kv.tiers.serde import encode_block
    h = b"\x01" * 32
    store.levels[0].tier.put(h, encode_block([{"k": torch.zeros(3)}]))
    assert store.take_prefix([h], 0) == [] and store.stats.errors["mismatch"] == 1
    store.close()


# ---- the cost model ---------------------------------------------------------------------------
def test_prefill_flops_counts_dense_work_and_causal_pairs():
    c = TINY
    dense = 2 * c.num_layers * (c.hidden_size * c.head_dim * (2 * c.num_heads
                                                              + 2 * c.num_kv_heads)
                                + 3 * c.hidden_size * c.intermediate_size)
    attn = 4 * c.num_layers * c.num_heads * c.head_dim
    assert prefill_flops(c, 0, 1) == dense + attn
    assert prefill_flops(c, 2, 4) == 2 * dense + attn * (3 + 4)
    assert prefill_flops(c, 0, 4) == prefill_flops(c, 0, 2) + prefill_flops(c, 2, 4)
    with pytest.raises(ValueError, match=r"\[5, 4\)"):
        prefill_flops(c, 5, 4)


def test_cost_model_weighs_bytes_against_flops_and_counts_decisions():
    model = CostModel(TINY, ["host", "disk"], compute_flops_per_s=1e9)
    recompute_s = prefill_flops(TINY, 0, 64) / 1e9
    assert model.recompute_s(0, 64) == pytest.approx(recompute_s)
    assert model.decide([("host", 1000)] * 4, 0, 64)                # microseconds < ms
    model.links["disk"].bandwidth_bytes_per_s = 1e3                  # a very slow disk
    assert not model.decide([("disk", 1000)] * 4, 0, 64)
    assert dict(model.decisions) == {"fetch": 1, "recompute": 1}
    model.observe_fetch("host", 10_000, 20e-6 + 1e-5)                # 10 kB in 10 us
    assert model.links["host"].bandwidth_bytes_per_s == pytest.approx(1e9)
    model.observe_run([(0, 1), (5, 6)], 1.0)                         # decodes only: ignored
    assert model.compute_flops_per_s == 1e9
    model.observe_run([(0, 64)], 2 * recompute_s)
    assert model.compute_flops_per_s == pytest.approx(0.5e9)


def test_the_store_recomputes_when_compute_is_cheaper():
    kv = make_cache(num_blocks=4)
    store = make_store(kv, "tiers(host=1MiB)")
    hashes, _ = fill_and_cache(kv, 3)
    evict_all(kv)
    store.cost.compute_flops_per_s = 1e30
    assert store.take_prefix(hashes, 0) == []
    assert store.cost.decisions["recompute"] == 1
    assert store.stats.num_recomputed_tokens == 3 * kv.block_size
    store.cost.compute_flops_per_s = 1.0
    assert len(store.take_prefix(hashes, 0)) == 3 and store.cost.decisions["fetch"] == 1
    store.close()


# ---- the engine with tiers ----------------------------------------------------------------------
TURN = SamplingParams(max_tokens=5, ignore_eos=True)
NUM_BLOCKS = 14        # 56 slots: one conversation's history fits, three do not


def run_conversations(llm, between=None, num_conversations=3, num_turns=3):
    """Round-robin multi-turn chats, one request at a time; each turn's prompt is the
    whole history (prompt, answer) plus a new message. Returns every answer."""
    history = random_prompts([18] * num_conversations, seed=7)
    messages = random_prompts([5] * (num_conversations * num_turns), seed=8)
    answers = []
    for turn in range(num_turns):
        for c in range(num_conversations):
            if between is not None:
                between(turn, c)
            out = llm.generate([history[c]], TURN)[0]
            assert out.finish_reason == "length"
            answers.append(out.token_ids)
            history[c] = history[c] + out.token_ids + messages[turn * num_conversations + c]
    llm.engine.check_integrity()
    return answers


@pytest.fixture(scope="module")
def recompute_answers():
    return run_conversations(make_tiny_llm(kv="fp32+recompute", num_blocks=NUM_BLOCKS))


@pytest.mark.parametrize("eviction", EVICTION_ORDERS)
@pytest.mark.parametrize("kind", TIER_KINDS)
def test_greedy_tokens_with_tiers_equal_recompute(kind, eviction, request, recompute_answers):
    spec = tier_spec(kind, eviction, request, capacity="40KiB")   # ~18 of ~30 blocks
    llm = make_tiny_llm(kv="fp32+" + spec, num_blocks=NUM_BLOCKS)
    request.addfinalizer(llm.engine.close)
    assert run_conversations(llm) == recompute_answers
    usage = llm.kv_usage()
    store = usage["tier_store"]
    assert store["num_promoted_blocks"] > 0 and store["errors"] == {}
    assert sum(t["num_hits"] for t in usage["tiers"].values()) == store["num_promoted_blocks"]
    assert all(t["errors"] == {} for t in usage["tiers"].values())
    assert sum(t["num_evictions"] for t in usage["tiers"].values()) > 0   # the order mattered
    resident = llm.engine.tier_resident_bytes()            # bytes per level
    assert resident.keys() == usage["tiers"].keys()
    assert all(r == usage["tiers"][name]["resident_bytes"] > 0
               for name, r in resident.items())
    if kind == "host+disk":
        assert usage["tiers"]["disk"]["num_hits"] > 0


def test_tiers_cut_the_prompt_tokens_computed():
    def computed(kv):
        llm = make_tiny_llm(kv=kv, num_blocks=NUM_BLOCKS)
        run_conversations(llm)
        return llm.engine.num_prefill_tokens
    assert computed("fp32+tiers(host=1MiB,fetch=always)") < computed("fp32+recompute") / 2


def test_a_lossy_disk_codec_runs_and_is_counted(tmp_path):
    llm = make_tiny_llm(kv=f"fp32+tiers(host=8KiB,disk=1MiB,disk_path={tmp_path},"
                           "disk_codec=int4,fetch=always)", num_blocks=NUM_BLOCKS)
    answers = run_conversations(llm)
    assert len(answers) == 9
    usage = llm.kv_usage()["tiers"]
    assert usage["disk"]["codec"] == "int4" and usage["disk"]["num_hits"] > 0
    llm.engine.close()
    assert list(tmp_path.iterdir()) == []               # the store's own dir is gone


def test_tiers_need_prefix_caching():
    with pytest.raises(ValueError, match="prefix caching is off"):
        make_tiny_llm(kv="fp32+tiers(host=1MiB)", enable_prefix_caching=False)


@pytest.mark.parametrize("fault", ["disk_full", "corrupt_files"])
def test_disk_faults_mid_run_lose_nothing(fault, tmp_path, monkeypatch, recompute_answers):
    llm = make_tiny_llm(kv=f"fp32+tiers(disk=1MiB,disk_path={tmp_path},fetch=always)",
                        num_blocks=NUM_BLOCKS)
    disk = llm.engine.offload.levels[0].tier

    def between(turn, conversation):
        if (turn, conversation) != (1, 1):
            return
        if fault == "disk_full":
            def full(path, mode="r", *args, **kwargs):
                if "w" in mode:
                    raise OSError(errno.ENOSPC, "No space left on device", str(path))
                return open(path, mode, *args, **kwargs)
            monkeypatch.setattr(disk_module, "open", full, raising=False)
        else:
            for path in disk.directory.glob("*.kvb"):
                path.write_bytes(path.read_bytes()[:100])   # truncated
    assert run_conversations(llm, between) == recompute_answers
    errors = llm.kv_usage()["tiers"]["disk"]["errors"]
    assert errors.get("disk_full" if fault == "disk_full" else "corrupt", 0) > 0
    llm.engine.close()


@pytest.mark.redis
@pytest.mark.parametrize("fault", ["killed", "killed_inside_a_put", "paused", "full"])
def test_redis_trouble_mid_run_loses_no_request(fault, redis_server, recompute_answers):
    llm = make_tiny_llm(kv=f"fp32+tiers(redis={redis_server.url},fetch=always)",
                        num_blocks=NUM_BLOCKS)
    tier = llm.engine.offload.levels[0].tier

    def between(turn, conversation):
        if (turn, conversation) != (1, 1):
            return
        if fault == "killed":
            redis_server.kill()
        elif fault == "killed_inside_a_put":          # mid step: the next demotion dies
            write = tier._write

            def dying_write(key, data):
                redis_server.kill()
                tier._write = write
                return write(key, data)
            tier._write = dying_write
        elif fault == "paused":
            redis_server.pause()
        else:
            tier.client.config_set("maxmemory-policy", "noeviction")
            tier.client.config_set("maxmemory", max(1, tier.client.info("memory")
                                                    ["used_memory"] - 4096))
    try:
        assert run_conversations(llm, between) == recompute_answers
    finally:
        if fault == "paused":
            redis_server.resume()
    errors = llm.kv_usage()["tiers"]["redis"]["errors"]
    expected = {"killed": "connection", "killed_inside_a_put": "connection",
                "paused": "timeout", "full": "oom"}[fault]
    assert errors.get(expected, 0) > 0, errors
    llm.engine.close()
