"""Endpoints that misbehave: each fault is a failed or unavailable cell naming the endpoint
and the cause, the in-process cell beside them is untouched, and the run resumes as any
run does. The servers are started by the runner and killed after (``fake_endpoint.py``),
or are a closed port."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import load_scenario

FAKE = Path(__file__).with_name("fake_endpoint.py")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake(name: str, mode: str, **extra) -> dict:
    return {"name": name, "model": "fake", "tokenizer": "bytes",
            "launch": f"{{python}} {FAKE} --port {{port}} --mode {mode}", **extra}


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("endpoint-faults")
    endpoints = [
        {"name": "down", "model": "fake", "tokenizer": "bytes",
         "url": f"http://127.0.0.1:{closed_port()}"},
        fake("unhealthy", "unhealthy", startup_timeout_s=2),
        fake("exits", "exit"),
        fake("nostream", "nostream"),
        fake("othermodel", "othermodel"),
        fake("nologprobs", "nologprobs"),
        fake("notext", "notext"),
        fake("generror", "error"),
    ]
    scenario = {
        "models": ["dummy:tiny"], "kv": ["fp32"], "cell_timeout_s": 120,
        "engine": {"kv_memory": "1MiB", "block_size": 4},
        "endpoints": endpoints,
        "workloads": [{"name": "throughput", "num_requests": 2, "prompt_len": 8, "output_len": 3,
                       "endpoints": ["down", "unhealthy", "exits", "nostream",
                                     "othermodel"]}],
        "tasks": [{"name": "prompt_ppl", "params": {"context_tokens": 32, "num_samples": 1},
                   "endpoints": ["nologprobs"]},
                  {"name": "generation", "params": {"context_tokens": 16, "num_samples": 1,
                                                    "continuation_tokens": 2},
                   "endpoints": ["notext", "generror"]}],
    }
    path = base / "faults.yaml"
    path.write_text(yaml.safe_dump(scenario))
    s = load_scenario(path)
    result = run_scenario(s, base / "run", show_progress=False)
    return s, base / "run", result


def by_kv(result) -> dict[str, dict]:
    return {c.kv: c for c in result.cells}


def test_each_fault_is_a_cell_that_names_the_endpoint_and_the_cause(faulty_run):
    _, _, result = faulty_run
    cells = by_kv(result)
    assert cells["fp32"].status == "ok"                    # the rest of the run goes on
    expected = {
        "down": ("failed", "is unreachable at"),
        "unhealthy": ("failed", "did not become healthy"),
        "exits": ("failed", "exited with code 3"),
        "nostream": ("failed", "no request completed (does it stream?"),
        "othermodel": ("failed", "does not serve model 'fake'"),
        "nologprobs": ("unavailable", "returned no prompt log-probabilities"),
        "notext": ("failed", "a completion without text"),
        "generror": ("failed", 'answered HTTP 500: {"error": {"message": "fake endpoint: '
                               'out of memory'),
    }
    for name, (status, cause) in expected.items():
        cell = cells[name]
        assert cell.status == status, (name, cell.error)
        assert f"endpoint {name!r}" in cell.error and cause in cell.error, \
            (name, cell.error)
    assert "exiting on purpose" in cells["exits"].error     # the server's last words
    assert result.num_failed == 7                       # an unavailable task is no failure


def test_server_output_goes_to_the_logs(faulty_run):
    _, run_dir, _ = faulty_run
    log = (run_dir / "logs" / "endpoint-exits.log").read_text()
    assert "exiting on purpose" in log and "--mode exit" in log


def test_a_failed_endpoint_run_resumes_like_any_run(faulty_run):
    s, run_dir, first = faulty_run
    again = run_scenario(s, run_dir, show_progress=False)
    assert again.num_ran == 0 and again.num_skipped == len(s.cells())
    assert [c.status for c in again.cells] == [c.status for c in first.cells]


def test_launched_servers_are_stopped(faulty_run):
    import subprocess
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(FAKE) not in out, "a launched fake server is still running"
