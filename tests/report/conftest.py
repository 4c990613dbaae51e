"""Fixtures of the report tests: a hand-made run directory (``RunStore`` records and
request rows) with known figures; no model runs."""
from __future__ import annotations

from pathlib import Path

import pytest
from types import SimpleNamespace

from kvmap.metrics import aggregate
from kvmap.bench.store import RunStore

SLO = {"ttft_p99_s": 0.5, "tbt_p99_s": 0.1}


def _rows(cell_id: str, kv: str, gap_s: float, ttft_s: float, n: int = 6) -> list[dict]:
    rows = []
    for i in range(n):
        arrival = 0.1 * i
        prompt = 100 + 50 * i
        times = [arrival + ttft_s + k * gap_s * (1 + 0.1 * (i % 2)) for k in range(8)]
        rows.append({"cell_id": cell_id, "model": "m", "kv": kv, "workload": "chat",
                     "request_id": f"r{i}", "arrival_s": arrival, "first_scheduled_s": arrival,
                     "finished_s": times[-1], "token_times_s": times,
                     "num_prompt_tokens": prompt, "num_output_tokens": len(times),
                     "ttft_s": times[0] - arrival, "tpot_s": (times[-1] - times[0]) / 7,
                     "e2e_s": times[-1] - arrival, "queue_s": 0.0, "failed": False})
    return rows


def _workload(kv: str, gap_s: float, ttft_s: float, peak: int, ops: int, duration_s: float,
              tiers=None):
    cell_id = f"{kv}-chat"
    rows = _rows(cell_id, kv, gap_s, ttft_s)
    metrics = aggregate(rows, duration_s=duration_s, slo=SLO)
    rate = metrics["output_tokens_per_s"]
    metrics.update(peak_kv_resident_bytes=peak, kv_bytes_per_token=peak / 1000,
                   tiers=tiers or {},
                   output_throughput_windows_tok_s=[rate * (1 + 0.01 * (k % 3 - 1))
                                                    for k in range(10)],
                   probes={"stability": {"identical": True, "num_tokens": 12,
                                         "num_identical_prefix": 12, "batch_size": 4},
                           "decode_ops": {"num_ops_per_step": ops}})
    return _record(cell_id, kv, "workload", metrics, workload="chat"), rows


def _record(cell_id, kv, kind, metrics, workload=None, task=None, details=None):
    return {"schema": "kvmap.bench.cell/1", "cell_id": cell_id, "kind": kind, "model": "m",
            "dtype": "bf16", "kv": kv, "workload": workload, "task": task, "params": {},
            "status": "ok", "error": None, "warnings": [], "metrics": metrics,
            "details": details or {}, "duration_s": 1.0, "env": {"load_avg_1m_end": 1.0}}


def _tasks(kv: str, ppl_delta: float, passkey: list[float], peak: int):
    grid = [{"context_tokens": n, "depth": d, "accuracy": a, "n": 1}
            for (n, d), a in zip([(1024, 0.1), (1024, 0.9), (2048, 0.1), (2048, 0.9)], passkey)]
    ppl = _record(f"{kv}-ppl", kv, "task",
                  {"ppl": 10 * (1 + ppl_delta / 100), "ppl_delta_pct": ppl_delta,
                   "delta_ppl_pct": {"mean": ppl_delta, "ci_low": ppl_delta - 0.2,
                                     "ci_high": ppl_delta + 0.2},
                   "peak_kv_resident_bytes": peak},
                  task="ppl")
    pk = _record(f"{kv}-passkey", kv, "task",
                 {"accuracy": sum(passkey) / len(passkey), "n": len(passkey), "grid": grid,
                  "peak_kv_resident_bytes": peak},
                 task="passkey", details={"per_sample": passkey})
    return [ppl, pk]


def make_run(path: Path, kv_memory: str = "64MiB") -> Path:
    """Two configurations: bf16 (the baseline) and int8 (faster, half the KV, 0.5% ppl
    rise, one passkey miss out of four, twice the operators, a host tier)."""
    scenario = SimpleNamespace(
        seed=0, fingerprint=lambda: "fake",
        to_dict=lambda: {"name": "fake", "description": "hand-made", "slo": SLO,
                         "engine": {"kv_memory": kv_memory}})
    store, _ = RunStore.open_for(path, scenario, "name: fake\n", ["kvmap", "bench"])
    tiers = {"host": {"num_hits": 30, "num_misses": 10, "hit_rate": 0.75,
                      "read_p50_s": 0.001, "read_p99_s": 0.004}}
    cells = [_workload("bf16", 0.05, 0.2, 40 << 20, 1000, 2.0),
             *[(t, []) for t in _tasks("bf16", 0.0, [1, 1, 1, 1], 30 << 20)],
             _workload("int8", 0.04, 0.3, 20 << 20, 2100, 1.5, tiers),
             *[(t, []) for t in _tasks("int8", 0.5, [1, 1, 1, 0], 15 << 20)]]
    for ordinal, (record, rows) in enumerate(cells):
        store.write_cell(record, rows, ordinal)
    store.finalize()
    return path


@pytest.fixture
def fake_run(tmp_path) -> Path:
    return make_run(tmp_path / "run")
