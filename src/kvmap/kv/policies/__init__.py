"""Selection-policy registry: spec-string name -> policy class (one file per policy)."""
from __future__ import annotations

from kvmap.kv.policies.base import Policy, ScoreInputs
from kvmap.kv.policies.full import Full
from kvmap.kv.policies.h2o import H2O
from kvmap.kv.policies.knorm import KNorm
from kvmap.kv.policies.random import Random
from kvmap.kv.policies.snapkv import SnapKV
from kvmap.kv.policies.streaming_llm import StreamingLLM
from kvmap.kv.policies.tova import TOVA
from kvmap.kv.policies.window import Window

POLICIES: dict[str, type[Policy]] = {
    c.name: c for c in (Full, Window, StreamingLLM, H2O, SnapKV, TOVA, KNorm, Random)}


def register(cls: type[Policy]) -> type[Policy]:
    POLICIES[cls.name] = cls
    return cls


__all__ = ["POLICIES", "Policy", "ScoreInputs", "register"]
