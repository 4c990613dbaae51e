"""Selection policies: every policy x budget x codec inside the paged engine (tiny random
fp32 Llama), the kept tokens' identities against a full-cache run, each policy's scoring
rule on synthetic inputs, and bad options.

Invariants checked after every ``engine.step()``:
- a sequence whose prompt is computed holds at most ``budget + block_size - 1`` slots,
  and exactly ``budget`` right after a compression;
- the pool holds exactly the blocks the running sequences' slots need (evicted blocks
  are back) and ``check_integrity()`` passes; at the end no block is used;
- every request produces ``max_tokens`` tokens.
"""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.codecs import CODECS
from kvmap.kv.compaction import read_sequence
from kvmap.kv.config import KVConfig
from kvmap.kv.policies import POLICIES, ScoreInputs
from kvmap.kv.policies.snapkv import pool_along_keys
from tests.conftest import make_tiny_llm, random_prompts

BLOCK_SIZE = 4
MAX_TOKENS = 20


def spec_of(policy: str, budget) -> str:
    """A spec string for ``policy`` at ``budget`` (a token count or a prompt fraction)."""
    return {
        "window": f"window(size={budget if isinstance(budget, int) else 12})",
        "streaming_llm": f"streaming_llm(sinks=2,budget={budget})",
        "h2o": f"h2o(budget={budget})",
        "snapkv": f"snapkv(budget={budget},window=4,kernel=3)",
        "tova": f"tova(budget={budget})",
        "knorm": f"knorm(budget={budget})",
        "random": f"random(budget={budget},seed=1)",
    }[policy]


SELECTIVE = sorted(set(POLICIES) - {"full"})
CODEC_NAMES = [c for c in ("fp32", "bf16", "int8", "int4", "kivi") if c in CODECS]


def run_checked(llm, prompts, max_tokens=MAX_TOKENS, on_step=None):
    """Run ``prompts`` to completion one step at a time, checking the invariants above.
    Returns the finished requests."""
    engine = llm.engine
    policy, bs = engine.policy, engine.kv.block_size
    reqs = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            for p in prompts]
    slots_before = {r.request_id: 0 for r in reqs}
    num_compressions = 0
    while engine.has_unfinished():
        computed_before = {r.request_id: r.num_computed_tokens for r in reqs}
        engine.step()
        engine.check_integrity()
        for r in reqs:
            if r.status.finished:
                continue
            budget = policy.budget_tokens(r.num_prompt_tokens)
            grew = r.num_computed_tokens - computed_before[r.request_id]
            if r.num_kv_slots < slots_before[r.request_id] + grew:     # compressed now
                assert r.num_kv_slots == budget, (r.num_kv_slots, budget)
                # the figure the planner and the simulator size the sequence by
                assert r.num_kv_slots == policy.resident_tokens(
                    r.num_computed_tokens, num_layers=engine.geom.num_layers,
                    num_prompt_tokens=r.num_prompt_tokens)
                num_compressions += 1
            if r.num_computed_tokens >= r.num_prompt_tokens:
                assert r.num_kv_slots <= budget + bs - 1, (r.num_kv_slots, budget)
            slots_before[r.request_id] = r.num_kv_slots
        running = [r for r in reqs if not r.status.finished]
        need = sum(-(-r.num_kv_slots // bs) for r in running)
        assert engine.kv_usage()["num_blocks_used"] == need      # evicted blocks returned
        if on_step is not None:
            on_step(reqs)
    assert engine.kv_usage()["num_blocks_used"] == 0
    assert engine.kv_usage()["num_compressions"] == num_compressions > 0
    for r in reqs:
        assert len(r.output_token_ids) == max_tokens
    return reqs


@pytest.mark.parametrize("codec", CODEC_NAMES)
@pytest.mark.parametrize("budget", [8, 0.5])
@pytest.mark.parametrize("policy", SELECTIVE)
def test_policy_matrix(policy, budget, codec):
    # Two requests, a step budget of 16 tokens: the 30-token prompt is prefilled in two
    # chunks while the other decodes, so decode rows and prefill segments mix.
    llm = make_tiny_llm(kv=f"{spec_of(policy, budget)}+{codec}", block_size=BLOCK_SIZE,
                        max_num_batched_tokens=16)
    run_checked(llm, random_prompts([30, 13], seed=2))


@pytest.mark.parametrize("policy", SELECTIVE)
def test_budget_above_the_sequence_changes_nothing(policy):
    prompts = random_prompts([21, 9], seed=3)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    ref = [o.token_ids for o in make_tiny_llm().generate(prompts, params)]
    spec = spec_of(policy, 64)                          # 64 > 21 + 12 tokens
    llm = make_tiny_llm(kv=spec + "+fp32")
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    assert llm.kv_usage()["num_compressions"] == 0


# ---- which tokens are kept -------------------------------------------------------------
def full_layer0_keys(token_ids: list[int]) -> torch.Tensor:
    """Layer-0 keys (N, H, D) of a full-cache run over ``token_ids``. Layer 0's key at
    position p depends only on token p and p itself, so a policy run must hold exactly
    these at the positions it kept, with their original rotary positions."""
    engine = make_tiny_llm(max_num_batched_tokens=256).engine
    req = engine.add_request(token_ids, SamplingParams(max_tokens=2, ignore_eos=True))
    engine.step()
    assert req.num_kv_slots == len(token_ids)
    return read_sequence(engine.kv, 0, req.block_ids, req.num_kv_slots)[0].clone()


def kept_positions(kept_keys: torch.Tensor, full_keys: torch.Tensor) -> torch.Tensor:
    """(H, L) token position of each kept layer-0 key, matched against the full run."""
    positions = []
    for h in range(kept_keys.shape[1]):
        diff = kept_keys[:, None, h] - full_keys[None, :, h]                 # (L, N, D)
        best = diff.abs().amax(dim=-1).min(dim=1)
        assert best.values.max() < 1e-5, "a kept key matches no token of the full run"
        positions.append(best.indices)
    return torch.stack(positions)


@pytest.mark.parametrize("policy", SELECTIVE)
def test_kept_tokens_are_the_policy_s_tokens(policy):
    llm = make_tiny_llm(kv=spec_of(policy, 8) + "+fp32", max_num_batched_tokens=16)
    engine = llm.engine
    snapshots = []          # (num_computed_tokens, layer-0 keys (L, H, D)) after each step

    def snap(reqs):
        r = reqs[0]
        if not r.status.finished and r.num_computed_tokens >= r.num_prompt_tokens:
            k = read_sequence(engine.kv, 0, r.block_ids, r.num_kv_slots)[0].clone()
            snapshots.append((r.num_computed_tokens, k))

    req = run_checked(llm, random_prompts([30], seed=4), on_step=snap)[0]
    full = full_layer0_keys(req.token_ids[:max(n for n, _ in snapshots)])
    p = engine.policy
    for n, keys in snapshots:
        pos = kept_positions(keys, full[:n])                                # (H, L)
        L = pos.shape[1]
        assert (pos.diff(dim=1) > 0).all(), "compaction must keep time order"
        expect_forced = list(range(min(p.num_sinks, L)))
        if policy in ("window", "streaming_llm"):                           # all forced
            expect_forced += range(n - (L - len(expect_forced)), n)
            assert pos.tolist() == [expect_forced] * pos.shape[0]
        elif policy in ("h2o", "snapkv"):
            recent = p.num_recent_kept(p.budget_tokens(req.num_prompt_tokens))
            assert (pos[:, L - recent:] == torch.arange(n - recent, n)).all()
        if policy == "tova":
            assert (pos == pos[0]).all(), "TOVA keeps the same tokens in every head"


# ---- scoring rules on synthetic inputs -----------------------------------------------
def inputs_of(num_slots=12, num_heads=2, head_dim=4, window=None, acc=None, keys=None):
    g = torch.Generator().manual_seed(0)
    k = keys if keys is not None else torch.randn(num_slots, num_heads, head_dim, generator=g)
    return ScoreInputs(0, k, torch.zeros_like(k), window, acc, num_slots)


def test_h2o_keeps_heavy_hitters_and_half_recent():
    acc = torch.zeros(2, 12)
    acc[0, [1, 3, 5]] = 5.0
    acc[1, [0, 2, 4]] = 5.0
    acc[1, 6] = 1.0
    kept = POLICIES["h2o"](budget=6).select(inputs_of(acc=acc), 6)
    assert kept.tolist() == [[1, 3, 5, 9, 10, 11], [0, 2, 4, 9, 10, 11]]   # recent = 6 // 2
    kept = POLICIES["h2o"](budget=6, recent=1).select(inputs_of(acc=acc), 6)
    assert kept[1].tolist() == [0, 2, 4, 6, 7, 11] or kept[1].tolist()[:4] == [0, 2, 4, 6]
    assert kept[:, -1].tolist() == [11, 11]


def test_snapkv_pools_window_votes_and_keeps_the_window():
    window = torch.zeros(2, 3, 20)                     # (H, W=3, L=20)
    window[:, :, 7] = 1.0                              # every query looks at token 7
    kept = POLICIES["snapkv"](budget=6, window=3, kernel=3).select(
        inputs_of(num_slots=20, window=window), 6)
    assert kept.tolist() == [[6, 7, 8, 17, 18, 19]] * 2   # 7 and its neighbours + window
    pooled = pool_along_keys(torch.tensor([[0., 3., 0., 0.]]), 3)
    assert torch.allclose(pooled, torch.tensor([[1., 1., 1., 0.]]))
    assert pool_along_keys(torch.ones(2, 9), 4).shape == (2, 9)       # even kernel too
    assert POLICIES["snapkv"](budget=2, window=32).num_recent_kept(2) == 2


def test_tova_averages_the_newest_query_over_heads():
    window = torch.zeros(2, 1, 10)
    window[0, 0, 2] = 1.0
    window[1, 0, 6] = 0.9
    kept = POLICIES["tova"](budget=2).select(inputs_of(num_slots=10, window=window), 2)
    assert kept.tolist() == [[2, 6], [2, 6]]


def test_knorm_keeps_the_smallest_keys():
    keys = torch.ones(10, 2, 4)
    keys[[3, 8], 0] = 0.1
    keys[[1, 4], 1] = 0.2
    kept = POLICIES["knorm"](budget=2).select(inputs_of(keys=keys), 2)
    assert kept.tolist() == [[3, 8], [1, 4]]


def test_random_depends_on_its_seed_only():
    inp = inputs_of(num_slots=64)
    a = POLICIES["random"](budget=8, seed=0).select(inp, 8)
    assert torch.equal(a, POLICIES["random"](budget=8, seed=0).select(inp, 8))
    assert not torch.equal(a, POLICIES["random"](budget=8, seed=1).select(inp, 8))


def test_fraction_budgets():
    assert POLICIES["snapkv"](budget=0.25).budget_tokens(1000) == 250
    assert POLICIES["h2o"](budget=0.1).budget_tokens(15) == 2
    assert POLICIES["tova"](budget=1.0).budget_tokens(37) == 37
    assert POLICIES["knorm"](budget=1).budget_tokens(37) == 1           # 1 is a count


@pytest.mark.parametrize("spec", [spec_of(p, b) for p in SELECTIVE for b in (8, 0.25)])
def test_resident_tokens_is_the_budget_capped_by_the_context(spec):
    policy = KVConfig.parse(spec).policy
    for context in (1, 7, 100, 5000):
        budget = policy.budget_tokens(context)
        assert policy.resident_tokens(context) == min(context, budget)
        assert policy.layer_resident_tokens(context, 3) == [min(context, budget)] * 3
        # at decode time a fractional budget stays a fraction of the prompt
        assert policy.resident_tokens(context + 50, num_prompt_tokens=context) == \
            min(context + 50, budget)
    assert POLICIES["full"]().resident_tokens(5000) == 5000


@pytest.mark.parametrize("spec,fragment", [
    ("h2o(budget=0)", "budget=0"),
    ("tova(budget=1.5)", "budget=1.5"),
    ("knorm(budget=-3)", "budget=-3"),
    ("snapkv(kernel=0)", "kernel=0"),
    ("snapkv(window=0)", "window=0"),
    ("snapkv(pooling=median)", "pooling='median'"),
    ("window(size=-1)", "size=-1"),
    ("h2o(recent=-2)", "recent=-2"),
    ("random(seed=-1)", "seed=-1"),
    ("streaming_llm(window=8,budget=0.5)", "exactly one of"),
    ("tova(window=4)", "no option 'window'"),
])
def test_bad_options_are_refused_by_name(spec, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        KVConfig.parse(spec)


def test_policies_compose_with_codecs():
    cfg = KVConfig.parse("snapkv(budget=0.25)+int8" if "int8" in CODECS else
                         "snapkv(budget=0.25)+bf16")
    assert cfg.policy.name == "snapkv" and cfg.codec.name in ("int8", "bf16")
    assert KVConfig.parse("full+fp32").policy is None
