"""Redis killed and restarted, paused and resumed, and answering slowly (through a proxy
of the test's own), mid-run: every request completes and the greedy tokens equal a run
without tiers; the faults are counted, and the tier serves again once Redis is back."""
from __future__ import annotations

import time

import pytest

from tests.conftest import make_tiny_llm
from tests.faults.slow_proxy import SlowProxy
from tests.kv.tiers.test_store import NUM_BLOCKS, run_conversations

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def no_tier_answers():
    return run_conversations(make_tiny_llm(kv="fp32+recompute", num_blocks=NUM_BLOCKS))


def redis_llm(url: str):
    llm = make_tiny_llm(kv=f"fp32+tiers(redis={url},fetch=always)", num_blocks=NUM_BLOCKS)
    return llm, llm.engine.offload.levels[0].tier


def wait_out_the_throttle(tier) -> None:
    time.sleep(max(0.0, tier._down_until_s - tier._clock()) + 0.01)


@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_redis_down_then_back_mid_run(fault, redis_server, no_tier_answers):
    llm, tier = redis_llm(redis_server.url)
    puts_when_back = []

    def between(turn, conversation):
        if (turn, conversation) == (1, 0):
            redis_server.kill() if fault == "killed" else redis_server.pause()
        elif (turn, conversation) == (2, 0):
            if fault == "killed":
                redis_server.start()                 # same port, empty server
            else:
                redis_server.resume()
            wait_out_the_throttle(tier)
            puts_when_back.append(tier.stats.puts)
    try:
        answers = run_conversations(llm, between)
    finally:
        if fault == "paused" and redis_server.proc is not None:
            redis_server.resume()
    assert answers == no_tier_answers
    errors = tier.stats.errors
    assert errors.get("connection" if fault == "killed" else "timeout", 0) > 0, errors
    assert tier.stats.puts > puts_when_back[0]       # it stored blocks again once back
    llm.engine.check_integrity()
    llm.engine.close()


@pytest.mark.parametrize("delay_s, expect_timeouts", [(0.02, False), (0.5, True)])
def test_slow_redis_mid_run(delay_s, expect_timeouts, redis_server, no_tier_answers):
    proxy = SlowProxy(redis_server.port)
    llm, tier = redis_llm(proxy.url)

    def between(turn, conversation):
        if (turn, conversation) == (1, 0):
            proxy.delay_s = delay_s
        elif (turn, conversation) == (2, 0):
            proxy.delay_s = 0.0
            wait_out_the_throttle(tier)
            hits_when_back.append(tier.stats.hits)
    hits_when_back = []
    try:
        assert run_conversations(llm, between) == no_tier_answers
    finally:
        proxy.close()
    timeouts = tier.stats.errors.get("timeout", 0)
    assert (timeouts > 0) == expect_timeouts, tier.stats.errors
    assert tier.stats.hits > hits_when_back[0]       # it serves again once fast
    llm.engine.close()
