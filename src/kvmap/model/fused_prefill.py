"""Prefill attention through torch's fused CPU kernel (``_scaled_dot_product_flash_
attention_for_cpu``: one pass with an online softmax, no score matrix in memory), for the
chunks ``attention.paged_attention`` gives it: on the CPU in fp32 (in bf16 where the CPU
multiplies bf16 natively, unless ``BF16_FLASH`` is switched off); no per-key statistics
asked for, no hole and no sliding window (those keep the tiled products)."""
from __future__ import annotations

import functools
import os

import torch
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def flash_usable(qs: torch.Tensor) -> bool:
    """torch's fused CPU attention runs this chunk: on the CPU in fp32, where it beat the
    tiled products of ``attention._causal_chunk`` (docs/hardware.md). In bf16 where the
    CPU multiplies bf16 natively (``BF16_FLASH``, on): a 2,000-token SmolLM2 prefill
    took 0.70 s against the tiled form's 1.44 s on x86-amx, and the chat task's greedy
    answers stopped on their own 26/32 against 28/32, within each other's intervals
    (``benchmarks/flash_prefill_ab.py``, record ``flash_prefill_ab-20261205-052824``)."""
    if _FLASH is None or qs.device.type != "cpu":
        return False
    if qs.dtype == torch.bfloat16:
        return BF16_FLASH and _native_bf16(os.environ.get("KVMAP_NATIVE_BF16"))
    return qs.dtype == torch.float32


BF16_FLASH = True     # off: bf16 keeps the tiled form (the A/B's reference)


@functools.lru_cache(maxsize=4)
def _native_bf16(forced: str | None) -> bool:
    """The profile's native-bf16 verdict (``forced``: ``KVMAP_NATIVE_BF16``, the key of
    the cache, so a test that forces the class sees its own verdict)."""
    from kvmap.hardware.profile import detect
    return detect().native_bf16


def flash_chunk(qs: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, num_past: int,
                lse: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of C queries after ``num_past`` cached keys, through the fused
    CPU kernel, in one pass over all L = num_past + C keys:

        keys ->   |<----- num_past ----->|<-- chunk -->|
        query i   sees every cached key and chunk keys 0..i

    qs (H, G, C, D) pre-scaled; kc, vc (H, L, D). Returns (H, G, C, D) in qs's dtype;
    with ``lse`` (H, G, C) fp32, each query's log-sum-exp is written there.

    Without cached keys the kernel's own causal mask runs (each KV head repeated for its
    G query heads: the kernel takes equal head counts). After cached keys the G query
    heads of a KV head are rows of one product under an explicit mask (no copy of the
    keys). Either way a query's keys are visited in the same blocks from key 0 with one
    online softmax, so its output is the same whether its prefix was cached or computed
    in this chunk -- bit for bit at bf16, within one ulp at fp32 (tested) -- and a
    prefix-cache hit does not change greedy tokens.
    An earlier form computed the cached part and the chunk apart and merged the two
    rounded outputs by log-sum-exp, which changed SmolLM2's greedy bf16 chat answers
    after a partial prefix hit."""
    H, G, C, D = qs.shape
    if num_past == 0:
        k = kc.repeat_interleave(G, 0)[None]                          # (1, H*G, C, D)
        v = vc.repeat_interleave(G, 0)[None]
        out, row_lse = _FLASH(qs.reshape(1, H * G, C, D), k, v, 0.0, True, scale=1.0)
    else:
        mask = _past_mask(C, num_past, G, qs.dtype)                   # (1, 1, G*C, L)
        out, row_lse = _FLASH(qs.reshape(1, H, G * C, D), kc[None], vc[None], 0.0, False,
                              attn_mask=mask, scale=1.0)
    if lse is not None:
        lse.copy_(row_lse.view(H, G, C))
    return out.view(H, G, C, D)


@functools.lru_cache(maxsize=2)
def _past_mask(num_queries: int, num_past: int, group: int,
               dtype: torch.dtype) -> torch.Tensor:
    """The additive mask of ``num_queries`` chunk queries after ``num_past`` cached keys,
    repeated for ``group`` query heads as rows: (1, 1, group * C, num_past + C). Cached:
    every layer of a chunk uses the same one."""
    i = torch.arange(num_queries)[:, None]
    j = torch.arange(num_past + num_queries)[None, :]
    mask = torch.zeros(num_queries, num_past + num_queries, dtype=dtype)
    mask.masked_fill_(j > num_past + i, float("-inf"))
    return mask.repeat(group, 1)[None, None]
