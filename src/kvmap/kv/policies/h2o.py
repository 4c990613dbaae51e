"""``h2o(budget=B, recent=N)``: heavy hitters by accumulated attention, plus recent tokens.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
Language Models" (NeurIPS 2023). A few tokens collect most of the attention mass; H2O
keeps those "heavy hitters" -- ranked by the attention each key has received, summed
over every query so far (prompt and generated) -- together with the ``recent`` newest
tokens. The paper splits the cache evenly between the two, which is the default here.

Parameters: ``budget`` -- tokens kept per layer, a count or a fraction of the prompt;
``recent`` -- newest tokens always kept (default: half of the budget); ``chunked`` --
compress after each prefill chunk (default true), ranking by the attention received so
far: it bounds the peak and measured no worse than compressing once
(``docs/policies.md``); ``layer_budgets`` -- ``pyramid`` or one budget per layer;
``layer_tables`` -- ``per-layer`` (a smaller layer's blocks go back to the pool; the
default where the codec allows) or ``shared`` (one table, masked; ``kvmap.kv.layer_pool``);
``decode_every`` -- decode steps between compressions during generation (default one
block; 0 = compress the prompt only; ``kvmap.kv.policies.base``).
Scores are per KV head (the attention of its query heads, summed).
"""
from __future__ import annotations

import torch

from kvmap.kv.policies.base import POLICIES, Policy, ScoreInputs


@POLICIES.register
class H2O(Policy):
    name = "h2o"
    defaults = {"budget": 0.25, "recent": None, "chunked": True,
                "layer_budgets": None, "layer_tables": None, "decode_every": None}
    needs_accumulated_attention = True

    def num_recent_kept(self, num_keep: int) -> int:
        recent = self.options["recent"]
        return num_keep // 2 if recent is None else recent

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        return inputs.accumulated_attention                                # (H, L)
