"""``knorm(budget=B)``: keep the keys with the smallest L2 norm.

Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression"
(EMNLP 2024): a low key norm goes with high attention, so the norm ranks tokens without
computing attention at all. Rotary embeddings rotate pairs of channels, so the norm of
the cached (rotated) key equals that of the raw key.

Parameters: ``budget`` -- tokens kept per layer, a count or a fraction of the prompt;
``chunked`` -- compress after each prefill chunk (default true; the norm of a key does
not depend on what follows it); ``layer_budgets`` -- ``pyramid`` or one budget per layer;
``layer_tables`` -- ``per-layer`` (a smaller layer's blocks go back to the pool; the
default where the codec allows) or ``shared`` (one table, masked; ``kvmap.kv.layer_pool``);
``decode_every`` -- decode steps between compressions during generation (default one
block; 0 = compress the prompt only; ``kvmap.kv.policies.base``).
"""
from __future__ import annotations

import torch

from kvmap.kv.policies.base import POLICIES, Policy, ScoreInputs


@POLICIES.register
class KNorm(Policy):
    name = "knorm"
    defaults = {"budget": 0.25, "chunked": True, "layer_budgets": None,
                "layer_tables": None, "decode_every": None}

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        return -inputs.keys.float().norm(dim=-1).T                        # (H, L)
