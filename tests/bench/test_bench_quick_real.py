"""`kvmap bench --quick` end to end on the real embedded model: the README's main job in
its two-minute form, through the real command line. Marked slow (runs in CI).

The run is made once per session and shared with tests/report/test_report_browser.py
(through the session's base temporary directory; `shared_quick_run` in tests/conftest.py)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import shared_quick_run

pytestmark = pytest.mark.slow


def test_bench_quick_writes_a_complete_run(tmp_path_factory):
    out, proc = shared_quick_run(tmp_path_factory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    rows = result["cells"]
    assert rows and all(r["status"] == "ok" for r in rows), rows
    for name in ("run.json", "index.sqlite", "requests.parquet", "report.html"):
        assert (out / name).exists(), name
    kvs = {r["kv"] for r in rows}
    # the baseline is the model's own dtype as the KV cache: `auto`, whichever this
    # machine's class makes it (bf16 with native bf16, fp32 without)
    from kvmap.hardware import detect
    base = detect().auto_dtype("cpu")
    assert {base, "int8"} <= kvs
    # the run ends in its trade-off map, with a recommendation for the scenario's SLA
    assert result["report"] == str(out / "report.html")
    assert result["recommendation"]["objective"] == "throughput"
    # the pool binds for either baseline (computed per dtype in
    # test_scenario_properties): int8 (about half bf16's bytes per token, a quarter of
    # fp32's) runs more sequences at once than the baseline
    concurrency = {r["kv"]: r["metrics"]["concurrency_max"] for r in rows
                   if r["workload"] == "throughput"}
    assert concurrency["int8"] > concurrency[base], concurrency
    assert all(r["metrics"]["kv_budget_tokens_bf16"] == 640 for r in rows
               if r["workload"] == "throughput")
    # the checklist probes ran once per configuration, in its first workload cell
    probed = [r for r in rows if r["kind"] == "workload" and r["metrics"].get("probes")]
    assert sorted(r["kv"] for r in probed) == sorted(kvs), probed
    for r in probed:
        assert r["metrics"]["probes"]["stability"]["num_tokens"] > 0, r["cell_id"]
        assert r["metrics"]["probes"]["decode_ops"]["num_ops_per_step"] > 0, r["cell_id"]
