"""``random(budget=B, seed=0)``: keep a uniformly random subset -- the control.

Any policy worth its cost must beat it at the same budget. The draw depends only on
``seed``, the layer and the number of cached slots, so a request keeps the same tokens
whatever else is in the batch or ran before.

Parameters: ``budget`` -- tokens kept per layer, a count or a fraction of the prompt;
``seed`` -- integer seed of the draws; ``chunked`` -- compress after each prefill chunk
(default true); ``layer_budgets`` -- ``pyramid`` or one budget per layer;
``layer_tables`` -- ``per-layer`` (a smaller layer's blocks go back to the pool; the
default where the codec allows) or ``shared`` (one table, masked; ``kvmap.kv.layer_pool``);
``decode_every`` -- decode steps between compressions during generation (default one
block; 0 = compress the prompt only; ``kvmap.kv.policies.base``).
"""
from __future__ import annotations

import torch

from kvmap.kv.policies.base import POLICIES, Policy, ScoreInputs


@POLICIES.register
class Random(Policy):
    name = "random"
    defaults = {"budget": 0.25, "seed": 0, "chunked": True, "layer_budgets": None,
                "layer_tables": None, "decode_every": None}

    def validate(self) -> None:
        super().validate()
        seed = self.options["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"random(seed={seed!r}) must be an integer >= 0")

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        L, H = inputs.keys.shape[:2]
        draw = ((self.options["seed"] * 1_000_003 + inputs.layer_idx) * 1_000_003 + L) % 2**63
        return torch.rand(H, L, generator=torch.Generator().manual_seed(draw))
