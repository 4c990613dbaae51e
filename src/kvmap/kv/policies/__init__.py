"""Selection-policy registry: spec-string name -> policy class (one file per policy)."""
from __future__ import annotations

POLICIES: dict[str, type] = {}


def register(cls: type) -> type:
    POLICIES[cls.name] = cls
    return cls


__all__ = ["POLICIES", "register"]
