"""Prefill attention through torch's fused CPU kernel (``model.fused_prefill``) against
the tiled products of ``attention._causal_chunk``, at fp32 and bf16, after cached keys
and without; and where each dtype takes it (bf16 only with native bf16 multiplies)."""
from __future__ import annotations

import pytest
import torch

from kvmap.model.attention import _causal_chunk
from kvmap.model.fused_prefill import _FLASH, flash_chunk, flash_usable

pytestmark = pytest.mark.skipif(_FLASH is None, reason="this torch build has no "
                                "_scaled_dot_product_flash_attention_for_cpu")

# worst absolute difference of an attention output (values ~N(0, 1)), each form rounding
# its inputs to the dtype: fp32 to its accumulation order; bf16 to a few of its 8-bit
# mantissa steps (2^-8 relative) over a softmax-weighted mean of unit values
BOUND = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_past", [0, 37])
def test_the_fused_kernel_equals_the_tiled_products(dtype, num_past):
    g = torch.Generator().manual_seed(3)
    H, G, C, D = 3, 3, 45, 64
    L = num_past + C
    qs = (torch.randn(H, G, C, D, generator=g) / D ** 0.5).to(dtype)
    kc = torch.randn(H, L, D, generator=g).to(dtype)
    vc = torch.randn(H, L, D, generator=g).to(dtype)
    lse_f = torch.empty(H, G, C, dtype=torch.float32)
    lse_t = torch.empty(H, G, C, dtype=torch.float32)
    fused = flash_chunk(qs, kc, vc, num_past, lse_f)
    tiled = _causal_chunk(qs, kc.transpose(1, 2), vc, num_past, None, lse_t)
    assert fused.dtype == dtype
    err = (fused.float() - tiled.float()).abs().max().item()
    assert err <= BOUND[dtype], err
    assert torch.allclose(lse_f, lse_t, atol=BOUND[dtype] * 4)


def test_bf16_takes_the_fused_kernel_only_with_native_bf16(monkeypatch):
    import kvmap.model.fused_prefill as fp
    assert fp.BF16_FLASH          # the default: on (benchmarks/flash_prefill_ab.py)
    monkeypatch.setattr(fp, "BF16_FLASH", True)
    q32 = torch.zeros(1, 1, 2, 8)
    q16 = q32.to(torch.bfloat16)
    monkeypatch.setenv("KVMAP_NATIVE_BF16", "1")
    assert flash_usable(q32) and flash_usable(q16)
    monkeypatch.setenv("KVMAP_NATIVE_BF16", "0")
    assert flash_usable(q32) and not flash_usable(q16)
    assert not flash_usable(q32.to(torch.float16))
    monkeypatch.setattr(fp, "BF16_FLASH", False)          # switched off: tiled again
    monkeypatch.setenv("KVMAP_NATIVE_BF16", "1")
    assert not flash_usable(q16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cached_prefix_gives_the_same_bits_as_computing_it(dtype):
    """A query's output is the same whether its prefix was cached (the masked call after
    ``num_past`` keys) or computed in the same chunk (the causal call): bit for bit at
    bf16, within one fp32 ulp at fp32 (0.7% of the values after 257 cached keys: the
    kernel's fp32 blocking) -- so a prefix-cache hit does not change a greedy token. The
    earlier merge of two rounded parts failed this at bf16."""
    torch.manual_seed(0)
    H, G, L, D = 3, 3, 300, 64
    q = (torch.randn(H, G, L, D) / 8).to(dtype)
    k, v = torch.randn(H, L, D).to(dtype), torch.randn(H, L, D).to(dtype)
    lse_all = torch.empty(H, G, L)
    whole = flash_chunk(q, k, v, 0, lse_all)
    for past in (16, 100, 257):
        lse = torch.empty(H, G, L - past)
        part = flash_chunk(q[:, :, past:].contiguous(), k, v, past, lse)
        if dtype == torch.bfloat16:
            assert torch.equal(part, whole[:, :, past:])
        else:
            assert (part - whole[:, :, past:]).abs().max() <= 2.0 ** -22
        assert torch.allclose(lse, lse_all[:, :, past:], rtol=0, atol=1e-6)
