"""Per-layer block tables (``kvmap.kv.layer_pool``): the pool's bookkeeping, and inside
the engine (tiny random fp32 Llama, 2 layers, block size 4) that they change memory and
nothing else: the same logits as the shared table, resident bytes equal to an exact
formula of the layer budgets, blocks back in the pool, preemption and batches intact.
"""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.config import KVConfig
from kvmap.kv.layer_pool import LayerBlockPool
from tests.conftest import make_tiny_llm, random_prompts

BS = 4


# ---- the pool -----------------------------------------------------------------------------
def test_pool_groups_and_released_layer_blocks():
    pool = LayerBlockPool(num_blocks=4, block_size=BS, num_layers=3)
    groups = pool.allocate(3)
    assert pool.num_used_layer_blocks == 9 and pool.num_free == 1
    pool.check_integrity([groups])
    assert pool.release_holes(groups, {1: (2, 12), 2: (4, 8)}) == 2 + 1   # wholly inside
    assert pool.num_used_layer_blocks == 6 and pool.num_free == 2
    assert pool.layer_table(1, groups) == [int(pool.members[groups[0], 1]), 0, 0]
    assert not pool.release(groups[1], 1)                  # already back: nothing twice
    pool.check_integrity([groups])
    more = pool.allocate(2)                                # the released blocks serve it
    pool.check_integrity([groups, more])
    with pytest.raises(MemoryError):
        pool.allocate(1)
    pool.free(groups + more)
    assert pool.num_used_layer_blocks == 0 and pool.num_free == 4
    pool.check_integrity([])
    with pytest.raises(ValueError, match="refcount is 0"):
        pool.free([groups[0]])


# ---- in the engine ------------------------------------------------------------------------
def llm_for(spec: str, codec: str = "fp32", **kw):
    return make_tiny_llm(kv=f"{spec}+{codec}", block_size=BS, max_num_batched_tokens=16, **kw)


def with_tables(spec: str, tables: str) -> str:
    return spec[:-1] + f",layer_tables={tables})"


@pytest.mark.parametrize("spec", ["h2o(budget=10,layer_budgets=10/10)",
                                  "h2o(budget=12,layer_budgets=pyramid)",
                                  "snapkv(budget=12,window=4,layer_budgets=16/6)",
                                  "tova(budget=12,layer_budgets=6/13)"])
def test_per_layer_tables_give_the_shared_tables_logits(spec):
    ids = random_prompts([70], seed=11)[0]
    logits = {}
    for tables in ("shared", "per-layer"):
        llm = llm_for(with_tables(spec, tables))
        assert llm.engine.kv.usage().layer_tables == tables
        logits[tables] = llm.engine.score(ids, num_context_tokens=40)     # 30 decode steps
    assert torch.equal(logits["shared"], logits["per-layer"])


def held_layer_blocks(n_slots: int, budgets: list[int]) -> list[int]:
    """Blocks layer l holds at n slots once compressed (``kvmap.kv.layer_pool``): all of
    its table but those wholly inside its hole (b_l, B), B = max budget."""
    top = max(budgets)
    return [-(-n_slots // BS) - max(0, top // BS - -(-b // BS)) for b in budgets]


@pytest.mark.parametrize("spec", ["h2o(budget=12,layer_budgets=pyramid)",
                                  "h2o(budget=12,layer_budgets=16/6)",
                                  "knorm(budget=12,layer_budgets=3/14)"])
def test_resident_bytes_are_the_layer_budgets_sum(spec):
    llm = llm_for(spec)
    engine, kv = llm.engine, llm.engine.kv
    req = engine.add_request(random_prompts([40], seed=7)[0],
                             SamplingParams(max_tokens=14, ignore_eos=True))
    budgets = engine.policy.layer_budget_tokens(40, 2)
    total = kv.pool.num_layer_blocks
    saw_release = False
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()
        if req.status.finished:
            break
        n = req.num_kv_slots
        if req.kv_holes:
            assert req.kv_holes == {l: (b, max(budgets)) for l, b in enumerate(budgets)
                                    if b < max(budgets)}
            held = held_layer_blocks(n, budgets)
            saw_release = saw_release or sum(held) < 2 * -(-n // BS)
        else:
            held = [-(-n // BS)] * 2
        assert kv.usage().resident_bytes == sum(held) * kv.layer_block_bytes
        assert len(kv.pool.free_layer_blocks) == total - sum(held)     # back in the pool
    assert saw_release
    assert kv.usage().resident_bytes == 0 and len(kv.pool.free_layer_blocks) == total


def test_batch_and_preemption_with_per_layer_tables():
    spec = "h2o(budget=12,layer_budgets=pyramid)"
    prompts = random_prompts([40, 23, 31, 9], seed=5)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    outs = {t: [o.token_ids for o in llm_for(with_tables(spec, t)).generate(prompts, params)]
            for t in ("shared", "per-layer")}
    assert outs["shared"] == outs["per-layer"]                 # a batch, no pool pressure
    small = llm_for(spec, num_blocks=10)                       # 10 groups for 4 sequences
    engine = small.engine
    for p in prompts:
        engine.add_request(p, params)
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()
    assert engine.scheduler.num_preemptions > 0
    assert len(engine.kv.pool.free_layer_blocks) == engine.kv.pool.num_layer_blocks


def test_layer_tables_option_errors_are_named():
    with pytest.raises(ValueError, match="layer_tables='x'"):
        KVConfig.parse("h2o(budget=8,layer_budgets=pyramid,layer_tables=x)")
    with pytest.raises(ValueError, match="layer_tables=per-layer needs one store"):
        llm_for("h2o(budget=12,layer_budgets=pyramid,layer_tables=per-layer)", "kivi")
    # unset: a codec with per-layer state keeps the shared table, and says so
    assert llm_for("h2o(budget=12,layer_budgets=pyramid)", "kivi").engine.kv.usage().layer_tables \
        == "shared"
    # no per-layer budgets: the default path, the shared table
    assert llm_for("h2o(budget=12)").engine.kv.usage().layer_tables == "shared"
