"""``window(size=N)``: keep the most recent N tokens (sliding-window attention).

Parameters: ``size`` -- tokens kept; ``chunked`` -- compress after each prefill chunk
(default true), so a long prompt never holds more than ``size`` + one chunk;
``decode_every`` -- decode steps between compressions during generation (default one
block; 0 = compress the prompt only; ``kvmap.kv.policies.base``).
"""
from __future__ import annotations

import torch

from kvmap.kv.policies.base import POLICIES, Policy, ScoreInputs


@POLICIES.register
class Window(Policy):
    name = "window"
    defaults = {"size": 1024, "chunked": True, "decode_every": None}

    def validate(self) -> None:
        size = self.options["size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"window(size={size!r}) must be an integer >= 1")
        if not isinstance(self.options["chunked"], bool):
            raise ValueError(f"window(chunked={self.options['chunked']!r}) must be true or false")
        self.validate_decode_every()

    def budget_tokens(self, num_prompt_tokens: int) -> int:
        return self.options["size"]

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        L, H = inputs.keys.shape[:2]
        return torch.arange(L, dtype=torch.float32).expand(H, L)   # newer = higher
