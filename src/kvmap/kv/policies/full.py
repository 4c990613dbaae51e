"""``full``: keep everything -- the baseline. Parsed to "no policy" by KVConfig."""
from __future__ import annotations

from kvmap.kv.policies.base import POLICIES, Policy


@POLICIES.register
class Full(Policy):
    name = "full"
    defaults = {}

    def validate(self) -> None:
        pass

    def layer_resident_tokens(self, context_tokens: int, num_layers: int,
                              num_prompt_tokens: int | None = None) -> list[int]:
        return [context_tokens] * num_layers           # everything, decoded tokens too
