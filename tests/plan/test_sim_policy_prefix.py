"""Prefix caching beside a selection policy in the simulator, as kvmap's engine does it:
the prompt's blocks are keyed before compaction, compaction is copy on write, and a
finished compacted sequence is continued by the next turn of its conversation. The hit
counts are checked against the real engine (tiny random model) on the same two turns."""
from __future__ import annotations

import pytest

from kvmap import SamplingParams
from kvmap.kv.config import KVConfig
from kvmap.plan.catalogue import get_model
from kvmap.plan.sim import EngineSettings, SimConfig, SimRequest
from kvmap.plan.sim.blocks import BlockStore
from kvmap.plan.sim.compaction import compact
from kvmap.plan.sim.engine import Simulator
from kvmap.plan.sim.hardware import gpu_hardware
from kvmap.plan.sim.state import SimState
from tests.conftest import make_tiny_llm, random_prompts

BS = 4
PROMPT, QUESTION = random_prompts([30, 10], seed=21)
NUM_OUTPUT = 6
NUM_TURNS = 3


def engine_hits(spec: str) -> list[int]:
    """Prompt tokens turns 2 and 3 take from the cache in the engine (turn k + 1 = turn
    k's prompt + its answer + a question)."""
    llm = make_tiny_llm(kv=spec, block_size=BS, max_num_batched_tokens=16)
    greedy = SamplingParams(max_tokens=NUM_OUTPUT, ignore_eos=True)
    prompt, hits = PROMPT, []
    for turn in range(NUM_TURNS):
        out = llm.generate([prompt], greedy)[0]
        if turn:
            hits.append(out.metrics.num_cached_prompt_tokens)
        prompt = prompt + out.token_ids + QUESTION
    llm.engine.close()
    return hits


def sim_hits(spec: str) -> list[int]:
    config = SimConfig(name="p", model=get_model("llama-3-8b"),
                       hardware=gpu_hardware("h100-80gb"), kv=KVConfig.parse(spec),
                       workload=None, engine=EngineSettings(block_size=BS,
                                                            max_num_batched_tokens=16))
    requests, history, prompt = [], 0, len(PROMPT)
    for turn in range(NUM_TURNS):
        requests.append(SimRequest(f"t{turn}", prompt, NUM_OUTPUT, 0.0, "c", turn, history))
        history = prompt + NUM_OUTPUT
        prompt = history + len(QUESTION)
    sim = Simulator(config, requests)
    assert sim.run().num_finished == NUM_TURNS
    sim.store.check_integrity()
    assert sim.store.num_used == 0
    done = {st.req.request_id: st for st in sim.done}
    return [done[f"t{turn}"].num_cached_prompt_tokens for turn in range(1, NUM_TURNS)]


# turn 1: 30 prompt tokens, 35 computed; turn 2: 46 prompt tokens, 51 computed
@pytest.mark.parametrize("spec, want", [
    ("fp32", [32, 48]),                               # the earlier turn's full blocks
    ("snapkv(budget=8,window=4,kernel=3)", [35, 51]),  # its compacted state
    ("streaming_llm(sinks=2,budget=8)", [35, 51]),
    ("snapkv(budget=64,window=4,kernel=3)", [32, 48]),  # under budget: never compacted
    ("snapkv(budget=40,window=4,kernel=3)", [32, 51]),  # compacted from turn 2 on
    # turn 2 continues turn 1's state and stays within its budget (41 of 46): it is
    # filed again as it finishes, its blocks taken from turn 1's state keeping their keys
    ("snapkv(budget=0.9,window=4,kernel=3)", [35, 51]),
])
def test_a_policy_keeps_prefix_hits_as_in_the_engine(spec, want):
    assert sim_hits(spec) == want
    assert engine_hits(spec) == want


def test_compaction_is_copy_on_write():
    """Blocks another request holds stay held (and keyed); sole-held ones are rewritten
    (keys forgotten) up to the kept count; the rest are cached under their keys."""
    store = BlockStore(16, 1, [])
    st = SimState(SimRequest("r", 20, 4), 0.0, num_computed=20)
    for j in range(5):
        assert store.claim(("c", j), 0.0)
        st.keys.append(("c", j))
    store.claim(("c", 0), 0.0)                       # another holder of block 0
    assert compact(store, st, 2, BS, 0.0)
    assert st.keys == [] and st.num_private == 2 and st.compacted
    assert store.refs == {("c", 0): 1}               # the other holder's, untouched
    assert len(store.hbm_cached) == 2
    assert ("c", 3) in store.hbm_cached and ("c", 4) in store.hbm_cached
    assert store.num_used == 3                       # block 0 + two private
    store.check_integrity()


@pytest.mark.parametrize("spec", ["snapkv(budget=0.25)+int8", "h2o(budget=64)",
                                  "streaming_llm(sinks=4,window=128)"])
def test_policies_with_tiers_conserve_blocks_and_hit(spec):
    """A multi-turn load over a small pool and tiers, with preemptions: every block comes
    back, the store's invariants hold, and later turns continue compacted states."""
    from kvmap.plan.sim.workload import requests_from_spec
    from tests.plan.test_sim import tiered_config
    config = tiered_config(kv=KVConfig.parse(spec))
    requests = requests_from_spec(config.workload)
    sim = Simulator(config, requests)
    result = sim.run()
    assert result.num_finished + result.num_rejected == len(requests)
    assert sim.store.num_used == 0
    sim.store.check_integrity()
    later = [st for st in sim.done if st.req.turn > 0]
    assert later and sum(st.num_cached_prompt_tokens for st in later) > 0
    assert sim.states
