"""``full``: keep everything -- the baseline. Parsed to "no policy" by KVConfig."""
from __future__ import annotations

from kvmap.kv.policies.base import Policy


class Full(Policy):
    name = "full"
    defaults = {}

    def validate(self) -> None:
        pass
