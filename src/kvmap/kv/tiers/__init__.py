"""Tier-layout registry: spec-string parts ``tiers(...)`` and ``recompute``."""
from __future__ import annotations

TIER_PARTS: dict[str, type] = {}


def register(cls: type) -> type:
    TIER_PARTS[cls.name] = cls
    return cls


__all__ = ["TIER_PARTS", "register"]
