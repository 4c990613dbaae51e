"""``tova(budget=B)``: Token Omission Via Attention.

Oren et al., "Transformers are Multi-State RNNs" (2024). When the cache is full, drop
the token that the newest query attends to least; the attention is averaged over the
layer's heads, so every head keeps the same tokens. After the prompt the newest query
is the prompt's last token; during decoding it is the step's token.

The engine evicts a block's worth of tokens at a time (when a sequence has grown one
block past its budget), ranked by the same newest-query attention, rather than one
token per step as in the paper.

With ``chunked=true`` the prompt is compressed after every prefill chunk, ranked by the
attention of each chunk's last token (TOVA's own rule, a chunk at a time): the peak is
the budget plus one chunk, but a chunk's last token is ordinary text, which drops what
only the question at the end would ask for, and retrieval measured clearly worse that
way (``docs/policies.md``) -- so the default is final-only (``chunked=false``): the
whole prompt is resident until its last token ranks it.

Parameters: ``budget`` -- tokens kept per layer, a count or a fraction of the prompt;
``chunked`` -- compress after each prefill chunk (default false); ``layer_budgets`` --
``pyramid`` or one budget per layer (``kvmap.kv.policies.layer_budgets``);
``layer_tables`` -- ``per-layer`` (a smaller layer's blocks go back to the pool; the
default where the codec allows) or ``shared`` (one table, masked; ``kvmap.kv.layer_pool``);
``decode_every`` -- decode steps between compressions during generation (default one
block; 0 = compress the prompt only; ``kvmap.kv.policies.base``).
"""
from __future__ import annotations

import torch

from kvmap.kv.policies.base import POLICIES, Policy, ScoreInputs


@POLICIES.register
class TOVA(Policy):
    name = "tova"
    defaults = {"budget": 0.25, "chunked": False, "layer_budgets": None,
                "layer_tables": None, "decode_every": None}
    needs_window_attention = True      # observation_window is 1: the newest query

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        newest = inputs.window_attention[:, -1]                           # (H, L)
        return newest.mean(0).expand_as(newest)
