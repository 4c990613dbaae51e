"""``streaming_llm(sinks=4, window=N)``: attention sinks plus a recent window.

Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (ICLR 2024):
the first few tokens absorb attention mass whatever their content, so keeping them
(``sinks``) with the ``window`` most recent tokens keeps the model stable. The budget
is ``sinks + window`` tokens; ``budget=B`` instead sets the window to B - sinks (a count,
or a fraction of the prompt). With ``chunked`` (the default) the prompt is compressed
after each prefill chunk, as StreamingLLM streams its input: the kept set is the same
sinks + window, and the peak is the budget plus one chunk. ``decode_every`` -- decode
steps between compressions during generation (default one block; 0 = compress the
prompt only; ``kvmap.kv.policies.base``).
"""
from __future__ import annotations

import math

import torch

from kvmap.kv.policies.base import POLICIES, Policy, ScoreInputs


@POLICIES.register
class StreamingLLM(Policy):
    name = "streaming_llm"
    defaults = {"sinks": 4, "window": None, "budget": None, "chunked": True,
                "decode_every": None}

    def validate(self) -> None:
        if (self.options["window"] is None) == (self.options["budget"] is None):
            raise ValueError("streaming_llm needs exactly one of window=N or budget=B "
                             f"(got window={self.options['window']!r}, "
                             f"budget={self.options['budget']!r})")
        if self.options["budget"] is None:
            self.options["budget"] = 1           # checked below through window
        super().validate()
        if self.options["window"] is not None and self.options["window"] < 1:
            raise ValueError(f"streaming_llm(window={self.options['window']!r}) must be >= 1")

    def budget_tokens(self, num_prompt_tokens: int) -> int:
        if self.options["window"] is not None:
            return self.num_sinks + self.options["window"]
        b = self.options["budget"]
        n = b if isinstance(b, int) else math.ceil(b * num_prompt_tokens)
        return max(n, self.num_sinks + 1)

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        L, H = inputs.keys.shape[:2]
        return torch.arange(L, dtype=torch.float32).expand(H, L)   # sinks are forced keeps
