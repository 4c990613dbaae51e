"""``LayerKindPeak``: a hybrid model's resident bytes per layer kind at the pool's peak,
which the bench's workload records carry (``peak_kv_resident_bytes_by_kind``)."""
from __future__ import annotations

from kvmap import SamplingParams
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.kv.layer_kinds import LayerKindPeak
from tests.conftest import make_tiny_llm, random_prompts


def run(llm, prompt_len: int):
    with track_peak_kv_bytes(llm.engine) as peak, LayerKindPeak(llm.engine.kv) as kinds:
        llm.generate(random_prompts([prompt_len], seed=3),
                     SamplingParams(max_tokens=3, ignore_eos=True))
    return peak[0], kinds.by_kind


def test_the_split_adds_up_to_the_peak_and_the_window_binds():
    llm = make_tiny_llm(model="dummy:tiny-hybrid", block_size=4, max_num_batched_tokens=16)
    peak, by_kind = run(llm, 100)
    block = llm.engine.kv.layer_block_bytes
    assert sum(by_kind.values()) == peak
    # the pool peaks while the last full 16-token chunk (tokens 80-95) is computed: the
    # global layer holds blocks 0-23, each sliding layer (window 8) the blocks from the
    # chunk's first live slot 80 - 8 + 1 = 73 (block 18) to 23, 6 blocks, before what
    # slid out is released; later the global layer grows to 26 blocks but the sliding
    # ones shrink to their window, a lower total
    assert by_kind == {"global": 24 * block, "sliding": 2 * 6 * block}


def test_an_all_global_model_has_no_split():
    llm = make_tiny_llm(block_size=4)
    peak, by_kind = run(llm, 40)
    assert peak > 0 and by_kind == {}
