"""Decoding-time compression (``decode_every``): option errors at parse time, and inside
the engine (tiny random fp32 Llama, block size 4) a long generation stays within
``budget + decode_every - 1`` slots, is compressed once every ``decode_every`` steps,
frees its tail blocks as it goes; ``decode_every=0`` compresses the prompt only.
"""
from __future__ import annotations

import pytest

from kvmap import SamplingParams
from kvmap.kv.config import KVConfig
from kvmap.kv.policies import POLICIES
from tests.conftest import make_tiny_llm, random_prompts

BLOCK_SIZE = 4


@pytest.mark.parametrize("value", ["-1", "true", "1.5", "x"])
@pytest.mark.parametrize("policy", ["h2o(budget=8", "snapkv(budget=8,window=2",
                                    "window(size=8", "streaming_llm(window=8"])
def test_bad_decode_every_is_refused_by_name(policy, value):
    with pytest.raises(ValueError, match=r"\(decode_every=.*must be an integer >= 0"):
        KVConfig.parse(f"{policy},decode_every={value})")


def test_decode_every_steps_default_is_one_block():
    assert POLICIES["h2o"](budget=8).decode_every_steps(16) == 16
    assert POLICIES["h2o"](budget=8, decode_every=5).decode_every_steps(16) == 5
    assert POLICIES["tova"](budget=8, decode_every=0).decode_every_steps(16) == 0


def test_resident_tokens_without_decode_compression_grow_with_the_output():
    p = POLICIES["h2o"](budget=10, decode_every=0)
    assert p.resident_tokens(100, num_prompt_tokens=40) == 10 + 60
    assert p.resident_tokens(30, num_prompt_tokens=40) == 10
    assert POLICIES["h2o"](budget=10).resident_tokens(100, num_prompt_tokens=40) == 10


def run(spec: str, prompt_len: int = 20, max_tokens: int = 40):
    """Generates step by step; returns (request, [(decode step, kv slots, blocks used)],
    compressions per step)."""
    llm = make_tiny_llm(kv=spec + "+fp32", block_size=BLOCK_SIZE, max_num_batched_tokens=64)
    engine = llm.engine
    req = engine.add_request(random_prompts([prompt_len], seed=3)[0],
                             SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    trace, compressions = [], []
    while engine.has_unfinished():
        before = engine.policy_runner.num_compressions
        engine.step()
        engine.check_integrity()
        if not req.status.finished:
            trace.append((len(req.output_token_ids), req.num_kv_slots,
                          engine.kv_usage()["num_blocks_used"]))
            compressions.append(engine.policy_runner.num_compressions - before)
    assert engine.kv_usage()["num_blocks_used"] == 0
    return req, trace, compressions


@pytest.mark.parametrize("every", [1, 3, 6, 10])
def test_decode_stays_within_budget_plus_interval(every):
    req, trace, compressions = run(f"h2o(budget=8,decode_every={every})")
    assert len(req.output_token_ids) == 40
    for _, slots, blocks in trace:
        assert slots <= 8 + every - 1
        assert blocks == -(-slots // BLOCK_SIZE)          # tail blocks were freed
    # one compression at the end of the prompt, then one every `every` decode steps
    assert compressions[0] == 1
    assert sum(compressions[1:]) == (len(trace) - 1) // every


def test_default_interval_equals_one_block():
    default, _, _ = run("h2o(budget=8)")
    explicit, _, _ = run(f"h2o(budget=8,decode_every={BLOCK_SIZE})")
    assert default.output_token_ids == explicit.output_token_ids


def test_decode_every_zero_compresses_the_prompt_only():
    req, trace, compressions = run("snapkv(budget=8,window=2,decode_every=0)")
    assert sum(compressions) == 1                         # the prompt, once
    for generated, slots, _ in trace:
        assert slots == 8 + generated - 1


def test_kvmap_specs_lists_the_options():
    from typer.testing import CliRunner

    from kvmap.cli import app
    result = CliRunner().invoke(app, ["specs", "--options"])
    assert result.exit_code == 0, result.output
    h2o = next(line for line in result.output.splitlines() if line.strip().startswith("h2o("))
    assert "decode_every=None" in h2o and "layer_tables=None" in h2o
