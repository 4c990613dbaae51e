"""Decode attention of one layer as one compiled kernel (CPU): gather the batch's blocks,
decode them through the codec, scores, mask, softmax and the weighted sum of values,
fused by inductor into loops that read each code once from the pool.

Why: in eager mode decode attention is a chain of whole-tensor passes -- gather the
blocks (``index_select``), decode them (unpack, scale, shift, cast: one pass each),
re-lay them out heads-first, then two batched products. At a large batch the K/V of the
batch are as many bytes as the weights, and each pass reads and writes all of them, so a
codec that halves the bytes of the cache saves little: its decode passes cost what its
smaller reads save. Compiled, the codec's own ``read`` (whatever the codec: the code is
traced, not re-implemented) becomes index arithmetic inside the dot products, so the
step reads the codes once and the saving of a smaller codec shows in the step time.

Arithmetic: K/V are decoded to the compute dtype exactly as ``codec.read`` returns them
(what attention sees is what the cache holds), then scores, softmax and the weighted sum
run in fp32 and the output is rounded once to the compute dtype. Each (sequence, head)
row is reduced on its own, over keys in order, so the result does not depend on the
other rows of the batch (padded keys add exact zeros).

Shapes: q (B, Hq, D) pre-scaled; table (B, nb) block ids; mask (B, L) fp32 additive
(0 or -inf, L = nb * block_size). Returns out (B, Hq * D) in q's dtype and, when asked,
the attention each key got, summed over the query heads of its KV head: (B, Hkv, L) fp32.

Opt-in with ``KVMAP_COMPILE=1``: measured under load it recompiled (int4, KIVI) or ran
slower than eager (bf16), see docs/architecture.md; a machine where inductor cannot
build keeps the eager path.
"""
from __future__ import annotations

import os
import warnings

import torch

ENABLED = os.environ.get("KVMAP_COMPILE", "0") == "1"   # opt-in: see docs/architecture.md
_broken: str | None = None        # why compiling failed once; then eager for good


def _attend(q: torch.Tensor, store, codec, table: torch.Tensor, mask: torch.Tensor,
            want_probs: bool):
    B, nb = table.shape
    k, v = codec.read(store, table.reshape(-1))                  # (B*nb, bs, H, D)
    _, bs, H, D = k.shape
    L = nb * bs
    G = q.shape[1] // H
    qf = q.float().view(B, 1, H, G, D)
    s = (qf * k.float().view(B, L, H, 1, D)).sum(-1) + mask.view(B, L, 1, 1)  # (B, L, H, G)
    p = torch.softmax(s, dim=1)
    o = (p.unsqueeze(-1) * v.float().view(B, L, H, 1, D)).sum(1)               # (B, H, G, D)
    out = o.reshape(B, H * G * D).to(q.dtype)
    probs = p.sum(-1).transpose(1, 2) if want_probs else None                  # (B, H, L)
    return out, probs


_compiled = None


def usable(device: torch.device) -> bool:
    """Whether the compiled path runs here (CPU, enabled, and it has not failed)."""
    return ENABLED and _broken is None and device.type == "cpu"


def fused_decode_attention(q, store, codec, table, mask, want_probs: bool = False):
    """The compiled kernel, or None when it cannot run (the caller then runs eager)."""
    global _compiled, _broken
    if _compiled is None:
        import torch._dynamo
        # one graph serves every layer and batch shape; a few more for sizes 1 and each
        # codec a process uses (tests build many)
        torch._dynamo.config.cache_size_limit = max(
            torch._dynamo.config.cache_size_limit, 64)
        _compiled = torch.compile(_attend, dynamic=True)
    try:
        return _compiled(q, store, codec, table, mask, want_probs)
    except Exception as e:  # noqa: BLE001 -- no compiler, unsupported op: run eager
        _broken = f"{type(e).__name__}: {e}"
        warnings.warn(f"compiled decode attention is off ({_broken[:200]}); running eager")
        return None
