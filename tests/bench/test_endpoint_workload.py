"""An endpoint's workload cell measures the server's ``/metrics`` through loadgen's
``measure_level`` (pages fetched during the level, parsed after it, never on the loop
while tokens are stamped) and keeps the record keys the report reads
(``endpoint_memory``, ``/work/notes/contract.md``). Against the stdlib fake endpoint."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kvmap.bench.endpoint_launch import free_port, is_healthy
from kvmap.bench.scenario import load_scenario

FAKE = Path(__file__).with_name("fake_endpoint.py")
NUM_REQUESTS = 4


@pytest.fixture(scope="module")
def fake_url():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port),
                             "--mode", "metrics"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not is_healthy(url, {}) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait()


def endpoint_cell(tmp_path, url: str, **endpoint):
    scenario = {"models": ["dummy:tiny"], "kv": ["fp32"],
                "endpoints": [{"name": "fake-ep", "url": url, "model": "fake",
                               "tokenizer": "bytes", "kv_memory": "1000", **endpoint}],
                "workloads": [{"name": "throughput", "num_requests": NUM_REQUESTS,
                               "prompt_len": 8, "output_len": 3}]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    (cell,) = load_scenario(path).endpoint_cells()
    return cell


def test_the_cell_scrapes_through_measure_level_and_keeps_its_keys(tmp_path, fake_url,
                                                                   monkeypatch):
    import kvmap.loadgen.level as level_module
    from kvmap.bench.endpoint_workload import run_endpoint_workload
    from kvmap.loadgen import server_metrics
    calls, parsed_at, done_at = [], [], []
    real_measure, real_parse = level_module.measure_level, server_metrics.parse_metrics

    async def spy_measure(*args, **kwargs):
        calls.append(kwargs)
        return await real_measure(*args, **kwargs)

    def spy_parse(text):
        parsed_at.append(time.monotonic())
        return real_parse(text)

    monkeypatch.setattr(level_module, "measure_level", spy_measure)
    monkeypatch.setattr(level_module, "parse_metrics", spy_parse)
    progress = []

    def on_progress(share: float) -> None:
        progress.append(share)
        done_at.append(time.monotonic())

    metrics, rows = run_endpoint_workload(endpoint_cell(tmp_path, fake_url), on_progress)
    assert len(calls) == 1 and calls[0]["path"] == "/metrics"
    assert calls[0]["interval_s"] == 0.25
    assert progress[-1] == 1.0 and len(progress) == NUM_REQUESTS
    # pages fetched during the cell (every 0.25 s of a cell > 1 s) are parsed after it
    assert parsed_at and min(parsed_at) >= max(done_at)
    assert metrics["num_completed"] == NUM_REQUESTS and len(rows) == NUM_REQUESTS
    # the last page (after the cell) read 0.1 x 4 completions: the peak, x kv_memory
    assert metrics["kv_usage_peak_frac"] == pytest.approx(0.1 * NUM_REQUESTS)
    assert metrics["peak_kv_resident_bytes"] == pytest.approx(1000 * 0.1 * NUM_REQUESTS)
    assert metrics["kv_memory_source"] == "vllm:kv_cache_usage_perc x kv_memory"
    assert metrics["kv_memory_note"] is None and metrics["kv_capacity_bytes"] == 1000
    for key in ("server", "output_throughput_windows_tok_s", "endpoint", "client_cpu_s",
                "needle_accuracy"):
        assert key in metrics, key


def test_without_a_metrics_path_the_cell_scrapes_nothing(tmp_path, fake_url):
    from kvmap.bench.endpoint_workload import run_endpoint_workload
    metrics, _ = run_endpoint_workload(endpoint_cell(tmp_path, fake_url, metrics=None),
                                       lambda _: None)
    assert metrics["num_completed"] == NUM_REQUESTS
    assert metrics["peak_kv_resident_bytes"] is None
    assert "no /metrics scrape succeeded" in metrics["kv_memory_note"]
