"""Selection-policy registry: spec-string name -> policy class (one file per policy)."""
from __future__ import annotations

from kvmap.kv.policies.base import Policy, ScoreInputs
from kvmap.kv.policies.full import Full
from kvmap.kv.policies.streaming_llm import StreamingLLM
from kvmap.kv.policies.window import Window

POLICIES: dict[str, type[Policy]] = {c.name: c for c in (Full, Window, StreamingLLM)}


def register(cls: type[Policy]) -> type[Policy]:
    POLICIES[cls.name] = cls
    return cls


__all__ = ["POLICIES", "Policy", "ScoreInputs", "register"]
