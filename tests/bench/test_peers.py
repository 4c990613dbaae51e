"""The peers of examples/peers.yaml: their install scripts (arguments, without installing),
the scenario file, the memory gauge of the OpenVINO wrapper, and -- when OpenVINO GenAI's
venv is installed (``scripts/openvino.sh``) -- the wrapper itself against the client the
bench uses: streamed completions with every token, usage, the prompt's log-probabilities
from ``echo`` in the shape ``endpoint_logprobs`` reads, and its ``/metrics`` gauge.

CI installs no peer; the test that needs one skips, naming the script to run."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from kvmap.bench.endpoint_memory import peak_memory

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("openvino.sh", "vllm_cpu.sh", "kvpress.sh", "loadtool.sh")
OPENVINO_PYTHON = Path(os.environ.get("KVMAP_OPENVINO_VENV", ROOT / ".venv-openvino")) \
    / "bin" / "python"


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse_and_refuse_bad_arguments(script):
    path = ROOT / "scripts" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    bad = subprocess.run(["bash", str(path), "--version", "latest"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 2 and "--version must look like" in bad.stderr
    unknown = subprocess.run(["bash", str(path), "--frobnicate"], capture_output=True,
                             text=True, timeout=30)
    assert unknown.returncode == 2 and "unknown argument '--frobnicate'" in unknown.stderr


def test_peers_scenario_parses_with_its_endpoints():
    from kvmap.bench.scenario import load_scenario
    scenario = load_scenario(ROOT / "examples" / "peers.yaml")
    names = {e.name for e in scenario.endpoints}
    assert {"ov-bf16", "ov-u8", "ov-u4", "ov-u8-evict", "vllm-fp8"} <= names
    by_name = {e.name: e for e in scenario.endpoints}
    assert "--kv-precision u4" in by_name["ov-u4"].launch
    assert by_name["ov-u8"].baseline == "ov-bf16"
    assert "--kv-cache-dtype fp8" in by_name["vllm-fp8"].launch


class _Scrape:
    """A /metrics scrape as ``peak_memory`` reads it (``total``, ``labelled``)."""

    def __init__(self, values: dict[str, float]):
        self.values = values

    def total(self, name):
        return self.values.get(name)

    def labelled(self, name):
        return {}


def test_openvino_usage_gauge_gives_the_memory_coordinate():
    scrapes = [_Scrape({"openvino:kv_cache_usage_ratio": f}) for f in (0.0, 0.25, 0.125)]
    out = peak_memory(scrapes, kv_memory_bytes=1000)
    assert out["peak_kv_resident_bytes"] == 250
    assert out["kv_memory_source"] == "openvino:kv_cache_usage_ratio x kv_memory"


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


@pytest.mark.slow
@pytest.mark.skipif(not OPENVINO_PYTHON.exists(),
                    reason="OpenVINO GenAI is not installed: run scripts/openvino.sh "
                           "(its own venv, .venv-openvino)")
def test_openvino_wrapper_serves_the_bench_client(tmp_path):
    from kvmap.bench.endpoint_launch import free_port, is_healthy, stop
    from kvmap.bench.endpoint_logprobs import from_echo
    from kvmap.loadgen.client import Endpoint, RawResult, send_request
    from kvmap.model.loader import embedded_model_path
    from kvmap.workloads.spec import WorkloadRequest
    import aiohttp

    port = free_port()
    process = subprocess.Popen(
        [str(OPENVINO_PYTHON), str(ROOT / "scripts" / "openvino_server.py"), "--model",
         str(embedded_model_path()), "--port", str(port), "--kv-precision", "u8",
         "--num-kv-blocks", "16"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not is_healthy(root, {}):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        endpoint = Endpoint(root, "smollm2", api="completions", stream=True,
                            ignore_eos=True, temperature=0.0)

        async def one() -> RawResult:
            async with aiohttp.ClientSession() as session:
                return await send_request(session, endpoint, WorkloadRequest(
                    "r0", "The capital of France is", max_tokens=12), RawResult("r0"))
        result = asyncio.run(one())
        assert result.error_kind is None, result.error
        assert result.num_output_tokens == 12 and len(result.chunk_times_s) >= 1
        ids = [504, 3575, 282, 4649, 314]
        answer = _post(f"{root}/v1/completions", {"prompt": ids, "max_tokens": 1,
                                                  "echo": True, "logprobs": 0})
        scores = from_echo(answer["choices"][0], len(ids), 0)
        assert not isinstance(scores, str), scores
        assert len(scores.logprobs) == len(ids) - 1
        assert all(v < 0 for v in scores.logprobs)
        with urllib.request.urlopen(f"{root}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert "openvino:kv_cache_usage_ratio" in text
    finally:
        stop(process)


# --- the load-tool cross-check (benchmarks/loadtool_check.py) ---------------------------
FIXTURE = ROOT / "tests" / "bench" / "fixtures" / "aiperf"
AIPERF = Path(os.environ.get("KVMAP_LOADTOOL_VENV", ROOT / ".venv-loadtool")) / "bin" / "aiperf"


def _bench_module(name: str):
    import importlib
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_aiperf_export_is_read_as_aiperf_reports_it_without_the_warmup():
    cmp = _bench_module("loadtool_compare")
    records = cmp.read_records(FIXTURE / "profile_export.jsonl")
    summary = json.loads((FIXTURE / "profile_export_aiperf.json").read_text())
    fig = cmp.tool_figures(records, summary)
    assert len(records) == 5 and fig["num_completed"] == 4      # one warm-up record dropped
    assert fig["num_output_tokens"] == 4 * 16
    for key, value in fig["reported"].items():                   # recomputed == its summary
        assert fig[key] == pytest.approx(value, rel=1e-9), key
    assert fig["output_tokens_per_s"] == summary["output_token_throughput"]["avg"]


def test_compare_pairs_figures_by_definition_and_flags_ten_percent():
    cmp = _bench_module("loadtool_compare")
    loadgen = {"ttft_p50_s": 0.1, "ttft_p99_s": 0.2, "tbt_p50_s": 0.05, "tbt_p99_s": 0.1,
               "tpot_p50_s": 0.05, "tpot_p99_s": 0.06, "output_tokens_per_s": 20.0}
    tool = {"ttft_p50_s": 0.109, "ttft_p99_s": 0.25, "chunk_gap_p50_s": 0.05,
            "chunk_gap_p99_s": None, "itl_p50_s": 0.04, "itl_p99_s": 0.06,
            "output_tokens_per_s": 21.0}
    rows = {r["figure"]: r for r in cmp.compare(loadgen, tool)}
    assert rows["TTFT P50"]["within"] is True and rows["TTFT P99"]["within"] is False
    assert rows["TBT P99"]["within"] is None                     # a missing value: no verdict
    assert rows["TPOT P50"]["tool"] == 0.04                      # aiperf's ITL is a TPOT
    assert rows["output tok/s"]["ratio"] == pytest.approx(1.05)


def test_aiperf_command_sends_what_loadgen_sends():
    peer = _bench_module("aiperf_peer")
    from kvmap.loadgen.schedule import Level
    argv = peer.command(Path("aiperf"), "http://127.0.0.1:1", "m", Path("d.jsonl"),
                        Level(concurrency=4), 24, Path("tok"), Path("out"), 0)
    assert argv[argv.index("--concurrency") + 1] == "4"
    assert "--use-server-token-count" in argv and "--streaming" in argv
    assert json.loads(argv[argv.index("--extra-inputs") + 1]) == {"ignore_eos": True,
                                                                   "temperature": 0.0}
    rate = peer.command(Path("aiperf"), "u", "m", Path("d"), Level(rate_per_s=0.5), 24,
                        Path("t"), Path("o"), 0)
    assert rate[rate.index("--request-rate") + 1] == "0.5"
    with pytest.raises(ValueError, match="rate or a concurrency"):
        peer.command(Path("aiperf"), "u", "m", Path("d"), Level(), 24, Path("t"), Path("o"), 0)


@pytest.mark.slow
@pytest.mark.skipif(not AIPERF.exists(), reason="aiperf is not installed: run "
                    "scripts/loadtool.sh (its own venv, .venv-loadtool)")
def test_aiperf_runs_against_a_server_and_counts_every_token(tmp_path):
    peer = _bench_module("aiperf_peer")
    vs = _bench_module("loadgen_vs_stdlib")
    from kvmap.loadgen.client import Endpoint
    from kvmap.loadgen.schedule import Level
    from kvmap.workloads.spec import WorkloadRequest
    requests = [WorkloadRequest(f"r{k}", f"prompt number {k}", max_tokens=5) for k in range(4)]
    tokenizer = peer.export_tokenizer(tmp_path / "tok")
    with vs.PacedServer(0.01, 0.005, 10) as server:
        fig = peer.run(AIPERF, Endpoint(server.url, "paced"), requests,
                       Level(concurrency=2), tokenizer, tmp_path / "run")
    assert fig["num_completed"] == 4 and fig["num_failed"] == 0
    assert fig["num_output_tokens"] == 4 * 5
