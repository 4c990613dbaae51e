"""The fault suite (issue 16): faults injected into real tiers, real Redis servers of the
tests' own on loopback and real ``kvmap bench`` processes; every test asserts correctness
(tokens, completion, nothing lost, nothing leaked), never timing."""
from __future__ import annotations

import pytest

from tests.kv.tiers.conftest import SKIP_REASON, RedisServer


@pytest.fixture
def redis_server():
    """A redis-server of the test's own, which the test may kill, pause and restart."""
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    server = RedisServer().start()
    yield server
    server.kill()
