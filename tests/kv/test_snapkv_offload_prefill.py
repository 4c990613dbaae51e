"""Prefill through the tiers (``snapkv(prefill=offload)+tiers(...)``,
``kvmap.kv.offload.prefill``) on the tiny random-weight Llama:

- every layer and head selects exactly the tokens end-of-prefill SnapKV selects (the
  observation window is scored over the paged-out keys too), for three codecs and three
  page sizes; the logits after the prompt and through decode-time compressions equal
  end-of-prefill SnapKV's within 1e-5;
- the pool's peak equals ``peak_blocks`` exactly, and is below the resident prefill's;
- pages go down during prefill and are all deleted once the kept tokens are back;
- two sequences prefilled through the tiers at once, a preempted one and one whose
  compression is put off all give the tokens they give alone / the exact tokens;
- combinations that cannot work are refused at parse time, by name.
"""
from __future__ import annotations

import re

import pytest
import torch

from kvmap import SamplingParams
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.kv.config import KVConfig
from kvmap.kv.offload.prefill import chunk_sizes, peak_blocks
from kvmap.kv.offload.page_frames import PAGE_PREFIX
from tests.conftest import make_tiny_llm, random_prompts

BS = 4
PROMPT, CONTINUATION, OTHER = random_prompts([200, 8, 170], seed=5)
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
LOGITS_ATOL = 1e-5          # fp32 compute: the paged merge only reorders fp32 sums


def spec(codec: str, offload: bool, page_blocks: int = 2, budget=0.25) -> str:
    policy = f"snapkv(budget={budget}" + (",prefill=offload)" if offload else ")")
    return f"{policy}+{codec}+tiers(host=4MiB,page_blocks={page_blocks})"


def recording_llm(kv: str, chunk: int = 32, **kwargs):
    """A tiny LLM whose policy records every selection (H, n) it makes, in order."""
    llm = make_tiny_llm(kv=kv, block_size=BS, max_num_batched_tokens=chunk, **kwargs)
    policy, selections = llm.engine.policy, []
    select = policy.select

    def recorded(inputs, num_keep):
        kept = select(inputs, num_keep)
        selections.append(kept)
        return kept

    policy.select = recorded
    return llm, selections


def scored(kv: str, **kwargs):
    """Selections, logits predicting CONTINUATION after PROMPT, and the pool's peak
    (blocks) of one teacher-forced run."""
    llm, selections = recording_llm(kv, **kwargs)
    with track_peak_kv_bytes(llm.engine) as peak:
        logits = llm.engine.score(PROMPT + CONTINUATION, num_context_tokens=len(PROMPT))
    return selections, logits, peak[0] // llm.engine.kv.bytes_per_block, llm


@pytest.mark.parametrize("page_blocks", [1, 2, 4])
@pytest.mark.parametrize("codec", ["fp32", "int8", "bf16"])
def test_selection_and_logits_equal_end_of_prefill_snapkv(codec, page_blocks):
    ref_sel, ref_logits, ref_peak, _ = scored(spec(codec, False))
    sel, logits, peak, llm = scored(spec(codec, True, page_blocks))
    paging = llm.kv_usage()["tier_store"]["paging"]
    assert paging["num_pages_out"] > 0 and paging["num_frames_read"] > 0
    # one prompt compression and one in decode, per layer
    assert len(sel) == len(ref_sel) == 2 * llm.engine.kv.geom.num_layers
    for kept, ref in zip(sel, ref_sel):
        assert torch.equal(kept, ref)
    torch.testing.assert_close(logits, ref_logits, atol=LOGITS_ATOL, rtol=0)
    assert peak < ref_peak


def test_without_the_paged_out_keys_the_selection_differs(monkeypatch):
    """The window must see the front: scored over resident keys only, it selects others
    (so the equality above can fail)."""
    import kvmap.model.attention as attention
    window = attention._window_attention

    def resident_only(qs, kc, w, hole=None, front=None):     # the front gets no votes
        scores = window(qs, kc, w, hole)                       # (H, W, L)
        if front is None:
            return scores
        return torch.cat([scores.new_zeros(scores.shape[:2] + (front.shape[1],)), scores], -1)

    monkeypatch.setattr(attention, "_window_attention", resident_only)
    ref_sel, *_ = scored(spec("fp32", False))
    sel, *_ = scored(spec("fp32", True))
    assert not all(torch.equal(a, b) for a, b in zip(sel, ref_sel))


@pytest.mark.parametrize("chunk,page_blocks,budget", [
    (32, 2, 0.25), (64, 4, 0.1), (16, 1, 0.1), (64, 2, 40), (48, 8, 0.3)])
def test_peak_equals_the_formula(chunk, page_blocks, budget):
    llm, _ = recording_llm(spec("fp32", True, page_blocks, budget), chunk=chunk)
    with track_peak_kv_bytes(llm.engine) as peak:
        llm.generate([PROMPT], GREEDY)
    policy = llm.engine.policy
    expected = peak_blocks(len(PROMPT), chunk, BS, page_blocks,
                           policy.budget_tokens(len(PROMPT)), policy.observation_window,
                           num_decode_steps=GREEDY.max_tokens - 1)
    assert peak[0] == expected * llm.engine.kv.bytes_per_block
    full_blocks = -(-(len(PROMPT) + GREEDY.max_tokens - 1) // BS)
    assert expected < full_blocks


def test_chunk_sizes_follow_the_scheduler():
    assert chunk_sizes(200, 32, 32) == [32] * 5 + [8, 32]
    assert chunk_sizes(64, 32, 32) == [32, 32]
    assert chunk_sizes(20, 32, 32) == [20]
    # the closed-form bounds of the module docstring hold for the replay
    assert peak_blocks(4096, 512, 16, 16, 1024, 32) == 64
    assert peak_blocks(4096, 512, 16, 16, 1024, 32, num_decode_steps=100) == 65
    # the prefill bound of the module docstring, P + ceil((C - 1) / bs), holds and is met
    bounds = [(peak_blocks(4096, c, 16, 16, 64, 32), 16 + -(-(c - 1) // 16))
              for c in range(100, 700, 37)]
    assert all(peak <= bound for peak, bound in bounds)
    assert any(peak == bound for peak, bound in bounds)


def page_keys(llm) -> list:
    return [k for lv in llm.engine.offload.levels for k in lv.tier.keys()
            if isinstance(k, str) and k.startswith(PAGE_PREFIX)]


def test_pages_go_down_during_prefill_and_are_deleted_after_selection():
    llm, _ = recording_llm(spec("fp32", True))
    engine = llm.engine
    req = engine.add_request(PROMPT, GREEDY)
    seen_pages = 0
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()
        if req.num_computed_tokens < req.num_prompt_tokens:
            seen_pages = max(seen_pages, len(page_keys(llm)))
            assert req.num_kv_slots < 2 * BS + 32       # < a page + one chunk resident
    assert seen_pages > 0
    assert page_keys(llm) == [] and engine.offload.pager.seqs == {}
    assert engine.kv.pool.num_used == 0


def test_two_sequences_prefilled_through_the_tiers_at_once_give_their_tokens_alone():
    kv = spec("fp32", True)
    alone = [recording_llm(kv)[0].generate([p], GREEDY)[0].token_ids for p in (PROMPT, OTHER)]
    llm, _ = recording_llm(kv, chunk=64)
    both = llm.generate([PROMPT, OTHER], GREEDY)
    assert [o.token_ids for o in both] == alone
    assert llm.kv_usage()["tier_store"]["paging"]["num_paged_requests"] == 2
    assert page_keys(llm) == []


def test_a_preempted_sequence_drops_its_pages_and_recomputes_the_same_tokens():
    kv = spec("fp32", True)
    alone = [recording_llm(kv)[0].generate([p], GREEDY)[0].token_ids for p in (PROMPT, OTHER)]
    llm, _ = recording_llm(kv, chunk=64, num_blocks=18)     # two at once do not fit
    both = llm.generate([PROMPT, OTHER], GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    # the last chunk took the blocks for the kept tokens: no compression was put off
    assert llm.engine.policy_runner.num_deferred == 0
    assert [o.token_ids for o in both] == alone
    assert page_keys(llm) == []


def test_a_put_off_compression_decodes_over_the_whole_context(monkeypatch):
    """No block for the kept tokens when the prompt completes: the sequence stays paged
    and decodes exactly (the full cache's tokens); its pages go when it finishes."""
    import kvmap.engine.policy_runner as policy_runner
    monkeypatch.setattr(policy_runner, "destination_blocks", lambda *a: None)
    full = make_tiny_llm(kv="fp32", block_size=BS, max_num_batched_tokens=32)
    expected = full.generate([PROMPT], GREEDY)[0].token_ids
    llm, selections = recording_llm(spec("fp32", True))
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == expected
    assert llm.engine.policy_runner.num_deferred == 1 and selections == []
    assert page_keys(llm) == []


@pytest.mark.parametrize("text,names", [
    ("snapkv(prefill=offload)", "no tiers(...) part"),
    ("snapkv(prefill=offload)+recompute", "'recompute' has no tier levels"),
    ("snapkv(prefill=offload,chunked=true)+tiers(host=1MiB)", "chunked=true"),
    ("snapkv(prefill=offload,evict_to=host)+tiers(host=1MiB)", "evict_to=host"),
    ("snapkv(prefill=host)+tiers(host=1MiB)", "resident or offload"),
    ("h2o(prefill=offload)+tiers(host=1MiB)", "no option 'prefill'"),
])
def test_combinations_that_cannot_work_are_refused_at_parse_time(text, names):
    with pytest.raises(ValueError, match=re.escape(names)):
        KVConfig.parse(text)


def test_a_prompt_larger_than_the_pool_is_refused_only_below_its_peak():
    kv = spec("fp32", True)
    with pytest.raises(ValueError, match="holds up to 16 KV blocks at once"):
        recording_llm(kv, chunk=64, num_blocks=14)[0].generate([PROMPT], GREEDY)
    expected = recording_llm(kv, chunk=64)[0].generate([PROMPT], GREEDY)[0].token_ids
    small, _ = recording_llm(kv, chunk=64, num_blocks=16)      # 200 tokens = 50 blocks
    assert small.generate([PROMPT], GREEDY)[0].token_ids == expected
