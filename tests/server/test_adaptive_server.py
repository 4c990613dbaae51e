"""A real adaptive switch in the server (tiny model): load makes requests wait, the
controller moves new requests to the int8 engine while the fp32 one drains and is closed;
when the load is gone it steps back. Switches show in /metrics."""
from __future__ import annotations

import threading
import time

import yaml

from tests.conftest import random_prompts
from tests.server.conftest import metric, start_server

POLICY = {"window_s": 2, "min_dwell_s": 0.2, "interval_s": 0.05,
          "levels": [{"kv": "fp32"},
                     {"kv": "int8", "up": {"num_waiting": 2},
                      "down": {"num_waiting": 0, "kv_usage": 0.05}, "max_num_seqs": 3}]}


def wait_for(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_switch_under_load_and_back(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    server = start_server(adaptive=str(policy), max_num_seqs=1)
    try:
        assert server.loop.active_kv == "fp32"
        prompts = random_prompts([6] * 5, vocab=256, seed=1)
        results = []

        def send(p):
            with server.client() as c:
                results.append(c.post("/v1/completions", json={
                    "prompt": p, "max_tokens": 120, "ignore_eos": True, "temperature": 0}))

        threads = [threading.Thread(target=send, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        # one runs, the others wait: num_waiting >= 2 -> switch to int8
        assert wait_for(lambda: server.loop.active_kv == "int8"), server.loop.switches
        # the level's own batch cap; the server's (1) elsewhere
        assert server.loop.active.config.scheduler.max_num_seqs == 3
        with server.client() as c:             # a request sent now runs on the new engine
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3,
                                                "return_token_ids": True})
        assert r.status_code == 200
        for t in threads:
            t.join(60)
        assert [r.status_code for r in results] == [200] * len(prompts)
        assert all(r.json()["usage"]["completion_tokens"] == 120 for r in results)
        # idle: every signal low -> back to fp32; the drained engines are closed
        assert wait_for(lambda: server.loop.active_kv == "fp32"), server.loop.switches
        assert wait_for(lambda: server.call(lambda loop: len(loop.engines)) == 1)
        events = [(e.from_kv, e.to_kv) for e in server.loop.switches]
        assert events[:2] == [("fp32", "int8"), ("int8", "fp32")]
        assert server.loop.switches[0].signals.num_waiting >= 2
        assert wait_for(lambda: metric(server, "kvmap:kv_config_switches_total")
                        == len(events))
        assert metric(server, "kvmap:kv_config_info", kv="fp32") == 1.0
        assert metric(server, "kvmap:kv_config_info", kv="int8") == 0.0
        assert wait_for(lambda: metric(server, "kvmap:engines") == 1.0)
    finally:
        server.close()


def test_bad_policy_file_fails_at_start(tmp_path):
    import pytest
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"levels": [{"kv": "fp32"},
                                              {"kv": "int8", "up": {"num_waiting": 1}}]}))
    with pytest.raises(ValueError, match="no 'down'"):
        start_server(adaptive=str(bad))
