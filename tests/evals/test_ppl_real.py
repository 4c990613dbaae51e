"""The ``ppl`` task on the real embedded model: int8 (per token) against the full-precision
cache of the machine's compute dtype (``auto``: bf16 or fp32) on natural
text. Short on purpose (2 samples x (448 context + 64 scored tokens), < 60 s on 2 cores);
``docs/evals.md`` has the full codec table at 1.5K context."""
from __future__ import annotations

import pytest

from kvmap.config import EngineArgs
from kvmap.evals import EvalOptions, evaluate

pytestmark = pytest.mark.slow


def test_int8_per_token_perplexity_within_one_percent_of_the_baseline():
    from kvmap.hardware import detect
    result = evaluate("ppl", ["int8(granularity=token)"],
                      EvalOptions(context_tokens=(448,), continuation_tokens=64, num_samples=2),
                      engine=EngineArgs(num_threads=1))
    base, m = result["baseline"]["metrics"], result["results"][0]["metrics"]
    assert result["baseline"]["kv"] == detect().auto_dtype("cpu") == result["dtype"]
    assert m["num_tokens_scored"] == 128
    assert 2.0 < base["ppl"] < 60.0                   # natural English for a 135M model
    assert abs(m["ppl_delta_pct"]) < 1.0, m
    assert m["top1_agreement"] >= 0.9 and m["kl_mean"] < 0.02, m
    assert m["kv_bytes_peak"] < base["kv_bytes_peak"]  # 1 byte + scales vs 2 or 4 a value
