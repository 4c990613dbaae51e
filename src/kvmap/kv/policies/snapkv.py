"""``snapkv(budget=B, window=32, kernel=11, pooling=avg, chunked=false)``: attention from
an observation window at the end of the prompt, pooled along the keys.

Li et al., "SnapKV: LLM Knows What You Are Looking for Before Generation" (2024). The
last ``window`` prompt tokens (in practice the question) already attend to what the
answer needs. Each key is scored by the attention it receives from those queries,
summed over them and over the query heads of its KV head (GQA; kvpress averages, the
same ranking), then smoothed by a 1-D pooling of width ``kernel`` along the keys so that
a selected token brings its neighbours. The observation window itself is always kept and
takes no part in the pooling (as in the reference code).

Why ``kernel=11`` (the paper and kvpress use 5-7): the question's queries attend to the
phrase that matches it ("...number for Lisbon is"), not to the answer that follows, and
a centred pooling keeps only ``kernel // 2`` tokens past that phrase. SmolLM2 writes a
5-digit key as a space and 5 digit tokens, so a kernel of 7 keeps only the key's first
digits next to the phrase and the model answers with a wrong tail; 11 keeps the whole
key. A wider observation window does not help: the extra queries vote for the same
phrase. The passkey figures behind these choices are in ``docs/policies.md``.

``chunked=true`` compresses after every prefill chunk, scoring each chunk with its own
last ``window`` queries (the peak is budget + one chunk instead of the whole prompt;
the early chunks' queries are text, not the question). During decoding (the engine
compresses again each time a sequence grows one block past its budget) the observation
window is the newest query alone.

Parameters: ``budget`` -- tokens kept per layer, a count or a fraction of the prompt;
``window`` -- observation queries (and forced recent tokens, at most the budget);
``kernel`` -- pooling width in tokens; ``pooling`` -- ``avg`` (the paper) or ``max``;
``chunked`` -- compress after each prefill chunk (default false); ``layer_budgets`` --
``pyramid`` or one budget per layer (``kvmap.kv.policies.layer_budgets``);
``layer_tables`` -- ``per-layer`` (a smaller layer's blocks go back to the pool; the
default where the codec allows) or ``shared`` (one table, masked; ``kvmap.kv.layer_pool``);
``decode_every`` -- decode steps between compressions during generation (default one
block; 0 = compress the prompt only; ``kvmap.kv.policies.base``); ``prefill`` --
``resident`` (the default: the whole prompt stays in the pool until the window scores
it) or ``offload`` (prefill through the tiers: each chunk's pages go down as they are
written and only the selected tokens come back; needs ``tiers(...)``;
``kvmap.kv.offload.prefill``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvmap.kv.policies.base import POLICIES, Policy, ScoreInputs


@POLICIES.register
class SnapKV(Policy):
    name = "snapkv"
    defaults = {"budget": 0.25, "window": 32, "kernel": 11, "pooling": "avg", "chunked": False,
                "layer_budgets": None, "layer_tables": None, "decode_every": None,
                "prefill": "resident"}
    needs_window_attention = True

    def validate(self) -> None:
        super().validate()
        for key in ("window", "kernel"):
            v = self.options[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"snapkv({key}={v!r}) must be an integer >= 1")
        if self.options["pooling"] not in ("avg", "max"):
            raise ValueError(f"snapkv(pooling={self.options['pooling']!r}) must be avg or max")
        prefill = self.options["prefill"]
        if prefill not in ("resident", "offload"):
            raise ValueError(f"snapkv(prefill={prefill!r}) must be resident or offload")
        if prefill == "offload" and self.options["chunked"]:
            raise ValueError("snapkv(prefill=offload): chunked=true compresses each chunk "
                             "while it is resident, so nothing is left to prefill through "
                             "the tiers; give chunked=false")
        if prefill == "offload" and self.options.get("evict_to") is not None:
            raise ValueError(f"snapkv(prefill=offload,evict_to={self.options['evict_to']}): "
                             f"soft eviction keeps the prompt's resident blocks by prefix "
                             f"hash, and prefill through the tiers leaves none resident; "
                             f"give one of the two")

    @property
    def prefill_offload(self) -> bool:
        """Prefill through the tiers (``prefill=offload``, ``kvmap.kv.offload.prefill``)."""
        return self.options["prefill"] == "offload"

    @property
    def observation_window(self) -> int:
        return self.options["window"]

    def num_recent_kept(self, num_keep: int) -> int:
        return min(self.options["window"], num_keep)

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        # As in the reference code, the observation window's own keys (always kept) take
        # no part in the pooling: their large votes would spill onto the keys before them.
        votes = inputs.window_attention.sum(1)                            # (H, L)
        num_scored = max(0, votes.shape[1] - self.options["window"])
        scores = torch.full_like(votes, float("inf"))
        if num_scored:
            scores[:, :num_scored] = pool_along_keys(
                votes[:, :num_scored], self.options["kernel"], self.options["pooling"])
        return scores


def pool_along_keys(scores: torch.Tensor, kernel: int, pooling: str = "avg") -> torch.Tensor:
    """Same-length 1-D pooling (stride 1, zero padding kernel // 2) of (H, L) scores."""
    pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
    L = scores.shape[-1]
    return pool(scores[:, None], kernel, stride=1, padding=kernel // 2)[:, 0, :L]
