"""The /metrics contract: vLLM names, types, labels and bucket boundaries; kvmap extras;
counters never decrease across scrapes while traffic flows."""
from __future__ import annotations

import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvmap.server.metrics import (ITL_BUCKETS_S, REQUEST_LATENCY_BUCKETS_S, TTFT_BUCKETS_S,
                                  build_1_2_5_buckets)
from tests.conftest import random_prompts
from tests.server.conftest import start_server

VLLM_LABELS = {"model_name", "engine"}

# name -> (type, extra labels besides model_name/engine, buckets or None)
CONTRACT = {
    "vllm:num_requests_running": ("gauge", set(), None),
    "vllm:num_requests_waiting": ("gauge", set(), None),
    "vllm:kv_cache_usage_perc": ("gauge", set(), None),
    "vllm:prefix_cache_queries": ("counter", set(), None),
    "vllm:prefix_cache_hits": ("counter", set(), None),
    "vllm:num_preemptions": ("counter", set(), None),
    "vllm:prompt_tokens": ("counter", set(), None),
    "vllm:generation_tokens": ("counter", set(), None),
    "vllm:request_success": ("counter", {"finished_reason"}, None),
    "vllm:time_to_first_token_seconds": ("histogram", set(), TTFT_BUCKETS_S),
    "vllm:inter_token_latency_seconds": ("histogram", set(), ITL_BUCKETS_S),
    "vllm:request_time_per_output_token_seconds": ("histogram", set(), ITL_BUCKETS_S),
    "vllm:e2e_request_latency_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_queue_time_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_inference_time_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_prefill_time_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_decode_time_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_prompt_tokens": ("histogram", set(), build_1_2_5_buckets(512)),
    "vllm:request_generation_tokens": ("histogram", set(), build_1_2_5_buckets(512)),
    "kvmap:request_aborted": ("counter", set(), None),
    "kvmap:kv_resident_bytes": ("gauge", {"tier"}, None),
    "kvmap:kv_capacity_bytes": ("gauge", {"tier"}, None),
    "kvmap:kv_evicted_tokens": ("counter", set(), None),
    "kvmap:kv_config_info": ("gauge", {"kv"}, None),
    "kvmap:kv_config_switches": ("counter", set(), None),
    "kvmap:engines": ("gauge", set(), None),
}
PROCESS = {"kvmap:process_resident_memory_bytes": "gauge",
           "kvmap:process_cpu_seconds": "counter"}


def scrape(server) -> dict:
    with server.client() as c:
        r = c.get("/metrics")
    assert r.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def counter_values(families: dict) -> dict:
    """Every monotone series: counters' _total and histograms' _count/_sum/_bucket."""
    out = {}
    for fam in families.values():
        if fam.type not in ("counter", "histogram"):
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def traffic(server, n=6):
    prompts = random_prompts([8, 30, 3, 50, 12, 20][:n], vocab=256, seed=9)
    with server.client() as c:
        for i, p in enumerate(prompts):
            r = c.post("/v1/completions", json={"prompt": p, "max_tokens": 5 + i,
                                                "temperature": 0, "stream": i % 2 == 1})
            assert r.status_code == 200


def test_names_types_labels_buckets(tiny_server):
    traffic(tiny_server)
    families = scrape(tiny_server)
    for name, (kind, extra, buckets) in CONTRACT.items():
        assert name in families, f"{name} missing"
        fam = families[name]
        assert fam.type == kind, (name, fam.type)
        samples = [s for s in fam.samples if not s.name.endswith("_created")]
        assert samples, name
        for s in samples:
            labels = set(s.labels) - {"le"}
            assert labels == VLLM_LABELS | extra, (name, s.labels)
            assert s.labels["model_name"] == "tiny"
        if buckets is not None:
            les = [float(s.labels["le"]) for s in samples if s.name.endswith("_bucket")]
            assert les == [float(b) for b in buckets] + [float("inf")], name
    for name, kind in PROCESS.items():
        assert families[name].type == kind
        assert families[name].samples[0].value > 0
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples
               if s.name.endswith("_total")}
    assert reasons == {"stop", "length"}          # "abort" is not a success
    info = {s.labels["kv"]: s.value for s in families["kvmap:kv_config_info"].samples}
    assert info == {"fp32": 1.0}


def test_values_follow_the_traffic(tiny_server):
    before = counter_values(scrape(tiny_server))
    key = ("vllm:time_to_first_token_seconds_count", (("engine", "0"), ("model_name", "tiny")))
    traffic(tiny_server, n=4)
    after = counter_values(scrape(tiny_server))
    assert after[key] == before.get(key, 0) + 4
    gen = ("vllm:generation_tokens_total", (("engine", "0"), ("model_name", "tiny")))
    assert after[gen] >= before.get(gen, 0) + 4          # at least one token each


def test_counters_never_decrease_across_scrapes(tiny_server):
    stop = threading.Event()

    def load():
        while not stop.is_set():
            traffic(tiny_server, n=3)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        previous = counter_values(scrape(tiny_server))
        for _ in range(15):
            current = counter_values(scrape(tiny_server))
            for key, value in previous.items():
                assert current.get(key, -1) >= value, key
            previous = current
    finally:
        stop.set()
        worker.join()


@pytest.mark.parametrize("max_value,expected", [(1, (1,)), (100, (1, 2, 5, 10, 20, 50, 100)),
                                                (512, (1, 2, 5, 10, 20, 50, 100, 200, 500))])
def test_1_2_5_buckets(max_value, expected):
    assert build_1_2_5_buckets(max_value) == expected


def test_tier_metrics_with_a_host_tier():
    """With tiers(host=...), blocks leaving the pool land in the host tier; its resident
    bytes, capacity and hit/miss/IO series appear with tier="host"."""
    server = start_server(kv="fp32+tiers(host=1MiB)", num_blocks=24)
    try:
        prompts = random_prompts([40, 40, 40, 40], vocab=256, seed=5)
        with server.client() as c:
            for p in prompts + prompts:          # the repeat can hit the host tier
                assert c.post("/v1/completions", json={"prompt": p, "max_tokens": 4,
                                                       "temperature": 0}).status_code == 200

        def host_used(families) -> bool:
            series = [s for name in ("kvmap:kv_tier_hits", "kvmap:kv_resident_bytes")
                      for s in families[name].samples if s.labels.get("tier") == "host"
                      and not s.name.endswith("_created")]
            return any(s.value > 0 for s in series)

        deadline = time.monotonic() + 5          # gauges refresh every 0.1 s
        families = scrape(server)
        while not host_used(families) and time.monotonic() < deadline:
            time.sleep(0.05)
            families = scrape(server)
        tiers = {s.labels.get("tier") for s in families["kvmap:kv_resident_bytes"].samples}
        assert {"pool", "host"} <= tiers
        cap = {s.labels["tier"]: s.value for s in families["kvmap:kv_capacity_bytes"].samples}
        assert cap["host"] == 2**20
        for name in ("kvmap:kv_tier_hits", "kvmap:kv_tier_misses", "kvmap:kv_tier_io_seconds"):
            assert families[name].type == "counter"
            assert any(s.labels["tier"] == "host" for s in families[name].samples)
        assert host_used(families)               # blocks really went to the host tier
    finally:
        server.close()


def test_tier_percentiles_are_computed_at_scrape_time_not_per_tick(monkeypatch):
    """The engine thread's 0.1 s tick reads tier counters only; the P99 read latency is
    computed when /metrics is scraped (from the tier's own latency window)."""
    from kvmap.kv.tiers import base
    from tests.server.conftest import start_server
    calls = []
    original = base.TierStats.as_dict
    monkeypatch.setattr(base.TierStats, "as_dict",
                        lambda self: calls.append(1) or original(self))
    server = start_server(kv="fp32 + tiers(host=1MiB)", num_blocks=24)
    try:
        with server.client() as c:
            for seed in range(4):       # distinct prompts that overflow the pool: demotions
                assert c.post("/v1/completions", json={
                    "prompt": [(seed * 37 + i) % 250 for i in range(60)], "max_tokens": 4,
                    "temperature": 0}).status_code == 200
            assert c.post("/v1/completions", json={"prompt": list(range(60)),
                                                   "max_tokens": 2}).status_code == 200
            time.sleep(0.5)                                  # several ticks
            assert calls == []
            server.call(lambda loop: loop.active.offload.levels[0].tier.stats
                        .read_latencies_s.extend([0.5] * 1000))
            time.sleep(0.3)
            text = c.get("/metrics").text
        assert calls == []
        p99 = [line for line in text.splitlines()
               if line.startswith("kvmap:kv_tier_read_p99_seconds") and 'tier="host"' in line]
        assert p99 and float(p99[0].rsplit(" ", 1)[1]) == pytest.approx(0.5)
    finally:
        server.close()
