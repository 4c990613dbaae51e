"""The selection policies: importing this package registers every policy in ``POLICIES``
(declared in ``base.py``; each policy file registers its class with
``@POLICIES.register``)."""
from __future__ import annotations

from kvmap.kv.policies import (  # noqa: F401  (they register)
    full, h2o, knorm, random, snapkv, streaming_llm, tova, window)
from kvmap.kv.policies.base import POLICIES, Policy, ScoreInputs

__all__ = ["POLICIES", "Policy", "ScoreInputs"]
