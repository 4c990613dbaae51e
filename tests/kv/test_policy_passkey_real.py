"""SnapKV's pooling width on the real embedded model (``dtype: auto``): the question's queries attend
to the phrase before the key, and a centred pooling of width k keeps only k // 2 tokens
after it. At a 25% budget the default ``kernel=11`` keeps the whole 5-digit key (a space
and 5 digit tokens) in a case where ``kernel=7`` keeps only its first digits and the
model's answer breaks off (docs/policies.md). Prefill runs in chunks of 256 tokens."""
from __future__ import annotations

import pytest

from kvmap.evals.passkey import run_passkey

pytestmark = pytest.mark.slow


def answer(kv: str) -> dict:
    from kvmap import LLM
    llm = LLM(kv=kv, device="cpu", max_num_batched_tokens=256)
    return run_passkey(llm, [1024], [0.1], samples=1, seed=0)["samples"][0]


def test_snapkv_default_kernel_keeps_the_whole_key():
    sample = answer("snapkv(budget=0.25)")
    assert sample["correct"], sample


def test_snapkv_kernel_7_cuts_the_key_short():
    sample = answer("snapkv(budget=0.25,kernel=7)")
    assert not sample["correct"], sample
    assert sample["output"].strip()[:2] == sample["expected"][:2], sample   # starts right
