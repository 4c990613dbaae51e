"""``endpoints:`` in a scenario: the format, the problems reported before any cell runs,
the cell grid, and the import direction that lets the bench use loadgen's transport."""
from __future__ import annotations

import sys

import pytest
import yaml

from kvmap.bench.endpoint_launch import launch_argv
from kvmap.bench.scenario import ScenarioError, load_scenario

BASE = {"models": ["dummy:tiny"], "kv": ["fp32", "int8"],
        "workloads": [{"name": "throughput", "num_requests": 2, "prompt_len": 8,
                       "output_len": 2, "arrival": ["closed:1", "closed:2"]}],
        "tasks": [{"name": "passkey", "params": {"context_tokens": [256], "depths": [0.5],
                                                 "num_samples": 1}}]}


def scenario(tmp_path, **changes):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, **changes}))
    return load_scenario(path)


def problems(tmp_path, **changes) -> str:
    with pytest.raises(ScenarioError) as e:
        scenario(tmp_path, **changes)
    return str(e.value)


def test_endpoints_are_configurations_in_the_grid(tmp_path):
    s = scenario(tmp_path, endpoints=[
        {"name": "srv", "model": "m", "kv_label": "served int8", "kv_memory": "1MiB",
         "launch": "{python} -m kvmap.cli serve --port {port} --served-model-name {model}"},
        {"name": "mine", "model": "m", "url": "http://localhost:8000/v1"}],
        tasks=[{**BASE["tasks"][0], "endpoints": ["mine"]}])
    cells = [c for c in s.cells() if c.endpoint is not None]
    assert [(c.kv, c.job) for c in cells] == [
        ("srv", "throughput@closed:1"), ("srv", "throughput@closed:2"),
        ("mine", "throughput@closed:1"), ("mine", "throughput@closed:2"), ("mine", "passkey")]
    srv = cells[0].endpoint
    assert srv.url == "http://127.0.0.1:{port}" and srv.kv_memory_bytes == 1 << 20
    assert srv.label == "srv (served int8)"
    argv = launch_argv(srv, 4321)
    assert argv[0] == sys.executable and argv[-3:] == ["4321", "--served-model-name", "m"]
    # the in-process grid is what it was (no accuracy task on random weights); a cell
    # round-trips to the cell process
    assert len([c for c in s.cells() if c.endpoint is None]) == 2 * 2
    from kvmap.bench.cellspec import CellSpec
    assert CellSpec.from_dict(cells[-1].to_dict()) == cells[-1]


def test_every_scenario_problem_is_reported_before_any_cell_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("KVMAP_ENDPOINT_HOSTS", raising=False)
    text = problems(tmp_path, endpoints=[
        {"name": "far", "model": "m", "url": "http://gpu-box.example:8000"},
        {"name": "keyed", "model": "m", "url": "http://127.0.0.1:1", "api_key": "sk-x"},
        {"name": "typo", "model": "m", "launch": "srv --port {prot}"},
        {"name": "noport", "model": "m", "launch": "srv --port 8000"},
        {"name": "int8", "model": "m", "url": "http://127.0.0.1:1"},
        {"name": "env", "model": "m", "url": "http://127.0.0.1:1",
         "api_key_env": "KVMAP_TEST_KEY_NOT_SET"},
        {"name": "odd", "model": "m", "url": "http://127.0.0.1:1", "colour": "red"},
        {"name": "remote-launch", "model": "m", "url": "http://10.1.2.3:{port}",
         "launch": "srv --port {port}"}],
        workloads=[{**BASE["workloads"][0], "endpoints": ["nobody"]}])
    for expected in ("host 'gpu-box.example' is not loopback",
                     "an API key is never read from the scenario file",
                     "unknown placeholder {prot}", "has no {port}",
                     "'int8' is already the name of a KV configuration",
                     "environment variable KVMAP_TEST_KEY_NOT_SET is not set",
                     "unknown key 'colour'", "a launched server is reached on loopback",
                     "endpoints: ['nobody'] must be a list of the scenario's endpoints"):
        assert expected in text, expected
    assert "sk-x" not in text


def test_the_users_own_hosts_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KVMAP_ENDPOINT_HOSTS", "gpu-box.example, other")
    monkeypatch.setenv("KVMAP_TEST_KEY", "sk-secret")
    s = scenario(tmp_path, endpoints=[{"name": "far", "model": "m",
                                       "url": "http://gpu-box.example:8000",
                                       "api_key_env": "KVMAP_TEST_KEY"}])
    entry = s.endpoints[0]
    assert entry.headers() == {"Authorization": "Bearer sk-secret"}
    assert "sk-secret" not in str(s.to_dict())          # never stored with the scenario


def test_scenarios_without_endpoints_keep_their_cell_ids(tmp_path):
    """Old runs resume: the endpoint fields are left out of the hashes when unset."""
    s = scenario(tmp_path)
    assert s.fingerprint() == scenario(tmp_path).fingerprint()
    data = s.cells()[0].to_dict()
    assert data["endpoint"] is None and data["workload"]["endpoints"] is None
    from kvmap.bench.cellspec import _cell_id, _drop_unset_endpoints
    _drop_unset_endpoints(data)
    assert "endpoint" not in data and "endpoints" not in data["workload"]
    assert s.cells()[0].cell_id == _cell_id(s.cells()[0])


def test_the_loadgen_modules_the_bench_uses_import_nothing_of_the_bench():
    from tests.test_import_cycles import import_graph
    graph = import_graph()
    used = {t for m, ts in graph.items() if m.startswith("kvmap.bench.")
            for t in ts if t.startswith("kvmap.loadgen")}
    assert used, "the bench no longer uses loadgen: drop this test"
    seen, todo = set(), list(used)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += graph.get(m, ())
    assert not {m for m in seen if m.startswith(("kvmap.bench", "kvmap.report"))}, seen


@pytest.mark.parametrize("text, kv_memory, peak, source, note", [
    ("vllm:kv_cache_usage_perc 0.25\n", 1000, 250.0, "vllm:kv_cache_usage_perc x kv_memory",
     None),
    ("vllm:gpu_cache_usage_perc 0.5\n", 1000, 500.0, "vllm:gpu_cache_usage_perc x kv_memory",
     None),
    ("llamacpp:kv_cache_usage_ratio 0.1\n", 1000, 100.0,
     "llamacpp:kv_cache_usage_ratio x kv_memory", None),
    ('kvmap:kv_resident_bytes{tier="pool"} 4096\n', None, 4096.0, "kvmap:kv_resident_bytes",
     None),
    ("vllm:kv_cache_usage_perc 0.25\n", None, None, None, "no kv_memory"),
    ("vllm:kv_cache_usage_perc 0\n", 1000, None, None, "read 0 at every scrape"),
    ("other_metric 1\n", 1000, None, None, "exports none of"),
    (None, 1000, None, None, "no /metrics scrape succeeded"),
])
def test_memory_comes_from_the_servers_kv_gauge(text, kv_memory, peak, source, note):
    from kvmap.bench.endpoint_memory import peak_memory
    from kvmap.loadgen.server_metrics import Scrape
    scrapes = [None] if text is None else [Scrape.parse(text), None]
    out = peak_memory(scrapes, kv_memory)
    assert out["peak_kv_resident_bytes"] == peak and out["kv_memory_source"] == source
    assert (out["kv_memory_note"] is None) if note is None else note in out["kv_memory_note"]


@pytest.mark.parametrize("mode, want", [
    ("vllmlogprobs", ([-0.5 - 0.01 * t for t in (20, 30, 40)],
                      [{f"t{t}": round(-0.5 - 0.01 * t, 6), "x": -9.0} for t in (20, 30, 40)])),
    ("nologprobs", "returned no prompt log-probabilities: no prompt log-probabilities for "
                   "echo"),
])
def test_prompt_logprobs_from_echo_or_vllms_extra(mode, want):
    """A server that refuses ``echo`` but answers vLLM's ``prompt_logprobs`` is read from
    that; one that gives neither makes the task unavailable, saying what it answered."""
    import subprocess
    from pathlib import Path

    from kvmap.bench.endpoint_launch import free_port, is_healthy
    from kvmap.bench.endpoint_spec import EndpointEntry, EndpointUnavailable
    from kvmap.bench.endpoint_tasks import EndpointLLM
    port = free_port()
    fake = Path(__file__).with_name("fake_endpoint.py")
    proc = subprocess.Popen([sys.executable, str(fake), "--port", str(port), "--mode", mode])
    try:
        import time
        deadline = time.monotonic() + 30
        while not is_healthy(f"http://127.0.0.1:{port}", {}) and time.monotonic() < deadline:
            time.sleep(0.1)
        llm = EndpointLLM(EndpointEntry("fake-ep", f"http://127.0.0.1:{port}", "fake"), None)
        if isinstance(want, str):
            with pytest.raises(EndpointUnavailable, match=want):
                llm.prompt_logprobs([10, 20, 30, 40])
        else:
            logprobs, top = llm.prompt_logprobs([10, 20, 30, 40], 2)
            assert logprobs == pytest.approx(want[0]) and top == want[1]
            assert list(top[0]) == ["t20", "x"]               # most likely first
            assert llm.prompt_logprobs([10, 20, 30, 40], 1).top == [
                {f"t{t}": round(-0.5 - 0.01 * t, 6)} for t in (20, 30, 40)]
    finally:
        proc.kill()
        proc.wait()


def test_echo_answers_give_the_top_k_cut_to_k_or_none_without_one():
    """OpenAI's shape holds up to k + 1 entries (the scored token added); the k most
    likely are kept. Log-probabilities without a top-k: a perplexity, no top-k."""
    from kvmap.bench.endpoint_logprobs import from_echo
    choice = {"logprobs": {"token_logprobs": [None, -1.0, -2.0, -0.5],
                           "top_logprobs": [None, {"a": -0.2, "b": -1.0, "own": -3.0},
                                            {"b": -0.1, "c": -0.9}, {"a": -0.5}]}}
    out = from_echo(choice, 3, 2)
    assert out.logprobs == [-1.0, -2.0] and out.top == [{"a": -0.2, "b": -1.0},
                                                        {"b": -0.1, "c": -0.9}]
    assert from_echo(choice, 3, 0).top is None
    bare = {"logprobs": {"token_logprobs": [None, -1.0, -2.0]}}
    assert from_echo(bare, 3, 5).top is None and from_echo(bare, 3, 5).logprobs == [-1.0, -2.0]
    assert "got 3 values for a 4-token prompt" in from_echo(bare, 4, 5)
