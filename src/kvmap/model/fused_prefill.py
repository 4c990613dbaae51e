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
    took 0.77 s against the tiled form's 1.24 s on x86-amx, and the chat task's greedy
    answers stopped on their own 26/32 against 28/32, within each other's intervals
    (``benchmarks/flash_prefill_ab.py``, record ``flash_prefill_ab-20261205-021037``)."""
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
    CPU kernel, in two parts merged exactly by log-sum-exp:

        keys ->   |<----- num_past ----->|<-- chunk -->|
        queries   every query sees all    causal (the kernel's own mask, aligned
                  (no mask; the G query    to the chunk's top-left: query i sees
                  heads of a KV head are   chunk keys 0..i)
                  rows of one product)

    qs (H, G, C, D) pre-scaled; kc, vc (H, L, D), L = num_past + C. Returns (H, G, C, D)
    in qs's dtype; with ``lse`` (H, G, C) fp32, each query's log-sum-exp is written there.
    The chunk part repeats each KV head for its G query heads (the kernel takes equal
    head counts); the past part needs no copy."""
    H, G, C, D = qs.shape
    own_k = kc[:, num_past:].repeat_interleave(G, 0)[None]              # (1, H*G, C, D)
    own_v = vc[:, num_past:].repeat_interleave(G, 0)[None]
    o_own, lse_own = _FLASH(qs.reshape(1, H * G, C, D), own_k, own_v, 0.0, True,
                            scale=1.0)                                   # (1, H*G, C, ...)
    o_own, lse_own = o_own.view(H, G, C, D), lse_own.view(H, G, C)
    if num_past == 0:
        if lse is not None:
            lse.copy_(lse_own)
        return o_own
    o_past, lse_past = _FLASH(qs.reshape(1, H, G * C, D), kc[None, :, :num_past],
                              vc[None, :, :num_past], 0.0, False, scale=1.0)
    o_past, lse_past = o_past.view(H, G, C, D), lse_past.view(H, G, C)
    total = torch.logaddexp(lse_past, lse_own)
    if lse is not None:
        lse.copy_(total)
    return (o_past * torch.exp(lse_past - total)[..., None]
            + o_own * torch.exp(lse_own - total)[..., None]).to(qs.dtype)

