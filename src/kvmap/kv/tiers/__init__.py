"""Tier-layout registry: spec-string parts ``tiers(...)`` and ``recompute``
(``layout.py``), looked up by name by ``kvmap.kv.config``."""
from __future__ import annotations

TIER_PARTS: dict[str, type] = {}


def register(cls: type) -> type:
    TIER_PARTS[cls.name] = cls
    return cls


from kvmap.kv.tiers import layout  # noqa: E402  (registers tiers and recompute)

__all__ = ["TIER_PARTS", "register", "layout"]
