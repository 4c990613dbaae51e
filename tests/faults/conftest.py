"""The fault suite (issue 16): faults injected into real tiers, real Redis servers of the
tests' own on loopback and real ``kvmap bench`` processes; every test asserts correctness
(tokens, completion, nothing lost, nothing leaked), never timing."""
from __future__ import annotations

from tests.kv.tiers.conftest import redis_server  # noqa: F401  (a server to kill/pause)
