"""``snapkv(budget=B, window=32, kernel=7, pooling=avg)``: attention from an observation
window at the end of the prompt, pooled along the keys.

Li et al., "SnapKV: LLM Knows What You Are Looking for Before Generation" (2024). The
last ``window`` prompt tokens (in practice the question) already attend to what the
answer needs. Each key is scored by the attention it receives from those queries,
summed over them, then smoothed by a 1-D pooling of width ``kernel`` along the keys so
that a selected token brings its neighbours (keeping whole phrases, not lone tokens).
The observation window itself is always kept.

The kernel must span what has to be kept whole: with SmolLM2's digit-by-digit tokenizer a
5-digit passkey is 6 tokens after the phrase the question points at, and at a 25% budget
``kernel=7`` kept the whole key in 9 of 15 passkey cells, ``kernel=11`` in 15 of 15
(``benchmarks/policies.py``).

During decoding (the engine compresses again each time a sequence grows one block past
its budget) the observation window is the newest query alone.

Parameters: ``budget`` -- tokens kept per layer, a count or a fraction of the prompt;
``window`` -- observation queries (and forced recent tokens, at most the budget);
``kernel`` -- pooling width in tokens; ``pooling`` -- ``avg`` (the paper) or ``max``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvmap.kv.policies.base import Policy, ScoreInputs


class SnapKV(Policy):
    name = "snapkv"
    defaults = {"budget": 0.25, "window": 32, "kernel": 7, "pooling": "avg"}
    needs_window_attention = True

    def validate(self) -> None:
        super().validate()
        for key in ("window", "kernel"):
            v = self.options[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"snapkv({key}={v!r}) must be an integer >= 1")
        if self.options["pooling"] not in ("avg", "max"):
            raise ValueError(f"snapkv(pooling={self.options['pooling']!r}) must be avg or max")

    @property
    def observation_window(self) -> int:
        return self.options["window"]

    def num_recent_kept(self, num_keep: int) -> int:
        return min(self.options["window"], num_keep)

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        votes = inputs.window_attention.sum(1)                            # (H, L)
        return pool_along_keys(votes, self.options["kernel"], self.options["pooling"])


def pool_along_keys(scores: torch.Tensor, kernel: int, pooling: str = "avg") -> torch.Tensor:
    """Same-length 1-D pooling (stride 1, zero padding kernel // 2) of (H, L) scores."""
    pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
    L = scores.shape[-1]
    return pool(scores[:, None], kernel, stride=1, padding=kernel // 2)[:, 0, :L]
