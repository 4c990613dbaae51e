"""`kvmap bench --quick` end to end on the real embedded model: the README's main job in
its two-minute form, through the real command line. Marked slow (runs in CI)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_quick_writes_a_complete_run(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kvmap.cli", "bench", "--quick", "--out",
                           str(out), "--json"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    rows = result["cells"]
    assert rows and all(r["status"] == "ok" for r in rows), rows
    for name in ("run.json", "index.sqlite", "requests.parquet"):
        assert (out / name).exists(), name
    kvs = {r["kv"] for r in rows}
    assert {"bf16", "int8"} <= kvs
