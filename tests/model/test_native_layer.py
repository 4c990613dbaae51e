"""The native layer (``kvmap.model.native_layer``) against the Python layer it replaces:
the same products; its norm and rotary are hand loops that round once where the Python
path rounds after each operator, so the two agree within the compute dtype's rounding.

Measured at this commit on the tiny random model (three requests, prefill chunks and
decode): fp32 logits within 3.3e-7 of the largest logit, bf16 within 5.6e-3, the
same tokens. The bounds below are 30x / 4x that; one bf16 rounding of the cache is
far outside the fp32 one."""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from kvmap.model import native_layer
from kvmap.model.linear import PackedLinear
from tests.conftest import make_tiny_llm, random_prompts

pytestmark = pytest.mark.skipif(native_layer.ops() is None,
                                reason="the native layer does not build here: "
                                       f"{native_layer.LIBRARY.broken}")
BOUND = {"fp32": 1e-5, "bf16": 2e-2}   # of the largest |logit|, every step
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _packs(dtype: str) -> bool:
    """Whether oneDNN prepacks a weight of ``dtype`` here (the native layer needs it):
    bf16 needs AVX-512BW/VL/DQ or AVX-NE-CONVERT, so an AVX2-only CPU (class x86-avx2)
    keeps its bf16 layers in Python."""
    return PackedLinear(torch.zeros(8, 8, dtype=DTYPES[dtype])).packed is not None


PACKED = [d for d in DTYPES if _packs(d)]
BF16_PACKS = pytest.mark.skipif("bf16" not in PACKED, reason=(
    "oneDNN does not prepack bf16 weights on this CPU (it needs AVX-512BW/VL/DQ or "
    "AVX-NE-CONVERT), so the native layer is not taken at bf16 here"))


def _run(monkeypatch, native: bool, **kwargs):
    """Tokens and the logits of every step of three requests (two prefill chunks)."""
    monkeypatch.setattr(native_layer, "ENABLED", native)
    llm = make_tiny_llm(max_num_batched_tokens=48, **kwargs)
    model = llm.engine.model
    assert all(native_layer.usable(layer) for layer in model.layers)
    seen, logits = [], model.logits

    def record(hidden):
        out = logits(hidden)
        seen.append(out.clone())
        return out
    monkeypatch.setattr(model, "logits", record)
    outs = llm.generate(random_prompts([90, 7, 33]),
                        SamplingParams(max_tokens=5, ignore_eos=True))
    return [o.token_ids for o in outs], seen


def _worst(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(a, b))


@pytest.mark.parametrize("dtype,kv", [("fp32", "fp32"),
                                      pytest.param("bf16", "bf16", marks=BF16_PACKS),
                                      ("fp32", "int8")])
def test_native_layer_agrees_with_the_python_layer(dtype, kv, monkeypatch):
    tokens, logits = _run(monkeypatch, True, dtype=dtype, kv=kv)
    ref_tokens, ref_logits = _run(monkeypatch, False, dtype=dtype, kv=kv)
    assert tokens == ref_tokens
    assert len(logits) == len(ref_logits) > 5
    assert _worst(logits, ref_logits) < BOUND[dtype]


@pytest.mark.parametrize("dtype", PACKED)
def test_native_layer_first_step_with_a_quantized_cache(dtype, monkeypatch):
    """int4 at each dtype the layer packs: the prefill's logits within the bound (later
    steps may take other tokens on random weights, and then differ by what the tokens
    differ)."""
    _, logits = _run(monkeypatch, True, dtype=dtype, kv="int4")
    _, ref_logits = _run(monkeypatch, False, dtype=dtype, kv="int4")
    assert _worst(logits[:1], ref_logits[:1]) < BOUND[dtype]


def test_the_bound_has_teeth(monkeypatch):
    """One bf16 rounding of the cache (an fp32 model with a bf16 KV cache) is far outside
    the fp32 bound: the bound tells a rounding apart."""
    _, logits = _run(monkeypatch, True, dtype="fp32", kv="fp32")
    _, rounded = _run(monkeypatch, False, dtype="fp32", kv="bf16")
    assert _worst(logits, rounded) > 10 * BOUND["fp32"]


@pytest.mark.parametrize("dtype", PACKED)
def test_native_layer_is_taken(dtype, monkeypatch):
    """The fast path runs (its operators show in the profile of a step)."""
    monkeypatch.setattr(native_layer, "ENABLED", True)
    llm = make_tiny_llm(dtype=dtype, kv=dtype)
    with torch.profiler.profile() as prof:
        llm.generate(random_prompts([5]), SamplingParams(max_tokens=2, ignore_eos=True))
    names = {e.name for e in prof.events()}
    assert {"kvmap_layer::pre_attn", "kvmap_layer::post_attn"} <= names
