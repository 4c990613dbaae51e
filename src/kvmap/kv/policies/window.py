"""``window(size=N)``: keep the most recent N tokens (sliding-window attention)."""
from __future__ import annotations

import torch

from kvmap.kv.policies.base import Policy, ScoreInputs


class Window(Policy):
    name = "window"
    defaults = {"size": 1024}

    def validate(self) -> None:
        size = self.options["size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"window(size={size!r}) must be an integer >= 1")

    def budget_tokens(self, num_prompt_tokens: int) -> int:
        return self.options["size"]

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        L, H = inputs.keys.shape[:2]
        return torch.arange(L, dtype=torch.float32).expand(H, L)   # newer = higher
