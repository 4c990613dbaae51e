"""Fixtures of the report tests: a hand-made run directory (``RunStore`` records and
request rows) with known figures; no model runs. Records are ``CellRecord``s and the
stored scenario is a real one (``parse_scenario``), as the bench writes them."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvmap.runs.record import CellRecord
from kvmap.bench.scenario_parse import parse_scenario
from kvmap.runs.store import RunStore
from kvmap.evals import TASKS
from kvmap.metrics import aggregate

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


def _record(cell_id, kv, kind, metrics, workload=None, task=None, details=None,
            task_kind=None) -> CellRecord:
    return CellRecord(cell_id=cell_id, kind=kind, model="m", dtype="bf16", kv=kv,
                      workload=workload, task=task, task_kind=task_kind, metrics=metrics,
                      details=details or {}, duration_s=1.0, env={"load_avg_1m_end": 1.0})


def _tasks(kv: str, ppl_delta: float, passkey: list[float], peak: int):
    grid = [{"context_tokens": n, "depth": d, "accuracy": a, "n": 1}
            for (n, d), a in zip([(1024, 0.1), (1024, 0.9), (2048, 0.1), (2048, 0.9)], passkey)]
    ppl = _record(f"{kv}-ppl", kv, "task",
                  {"ppl": 10 * (1 + ppl_delta / 100), "ppl_delta_pct": ppl_delta,
                   "delta_ppl_pct": {"mean": ppl_delta, "ci_low": ppl_delta - 0.2,
                                     "ci_high": ppl_delta + 0.2},
                   "peak_kv_resident_bytes": peak},
                  task="ppl", task_kind="ppl")
    pk = _record(f"{kv}-passkey", kv, "task",
                 {"accuracy": sum(passkey) / len(passkey), "n": len(passkey), "grid": grid,
                  "peak_kv_resident_bytes": peak},
                 task="passkey", details={"per_sample": passkey}, task_kind="accuracy")
    return [ppl, pk]


def make_run(path: Path, kv_memory: str = "64MiB") -> Path:
    """Two configurations: bf16 (the baseline) and int8 (faster, half the KV, 0.5% ppl
    rise, one passkey miss out of four, twice the operators, a host tier)."""
    tiers = {"host": {"num_hits": 30, "num_misses": 10, "hit_rate": 0.75,
                      "read_p50_s": 0.001, "read_p99_s": 0.004}}
    cells = [_workload("bf16", 0.05, 0.2, 40 << 20, 1000, 2.0),
             *[(t, []) for t in _tasks("bf16", 0.0, [1, 1, 1, 1], 30 << 20)],
             _workload("int8", 0.04, 0.3, 20 << 20, 2100, 1.5, tiers),
             *[(t, []) for t in _tasks("int8", 0.5, [1, 1, 1, 0], 15 << 20)]]
    return store_run(path, cells, {"name": "fake", "description": "hand-made", "slo": SLO,
                                   "engine": {"kv_memory": kv_memory}})


def scenario_of(records, data: dict):
    """The scenario a bench run of ``records`` stored, from ``data`` (its name,
    description, SLA, engine, and per workload name its own SLA: ``{"workloads":
    [{"name": ..., "slo": ...}]}``) -- parsed for real. The report reads the name, the
    description, the SLAs and ``engine.kv_memory``; models, KV list and jobs are the
    records' (on the tiny model)."""
    slos = {w["name"]: w.get("slo") for w in data.get("workloads") or ()}
    workloads = list(dict.fromkeys(r.workload.partition("@")[0] for r in records
                                   if r.workload))
    tasks = list(dict.fromkeys(r.task for r in records if r.task))
    return parse_scenario({
        **{k: v for k, v in data.items() if k != "workloads"},
        "models": ["dummy:tiny"], "kv": list(dict.fromkeys(r.kv for r in records)),
        "workloads": [{"name": w, "kind": "synthetic", "num_requests": 2,
                       **({"slo": slos[w]} if slos.get(w) else {})} for w in workloads],
        "tasks": [{"name": t, "task": t if t in TASKS else "generation"} for t in tasks]})


def store_run(path: Path, cells, scenario: dict) -> Path:
    """A finished run directory holding ``cells`` ((record, rows) pairs) in order."""
    parsed = scenario_of([record for record, _ in cells], scenario)
    store, _ = RunStore.open_for(path, parsed, f"name: {scenario['name']}\n",
                                 ["kvmap", "bench"])
    for ordinal, (record, rows) in enumerate(cells):
        store.write_cell(record, rows, ordinal)
    store.finalize()
    return path


@pytest.fixture
def fake_run(tmp_path) -> Path:
    return make_run(tmp_path / "run")


# ---- a load sweep with known SLA capacities ------------------------------------------------

SWEEP_SLO = {"ttft_p99_s": 1.0, "tbt_p99_s": 0.1}
LEVELS = (4.0, 16.0, 64.0)
# kv -> per level (TTFT s, TBT s), every request alike so each P99 is that value exactly.
# Against SWEEP_SLO: bf16 crosses TTFT between 4 and 16 at 4 + (1-.5)/(1.5-.5)*12 = 10;
# int8 crosses TTFT between 16 and 64 at 16 + (1-.6)/(1.4-.6)*48 = 40; int4 meets it at
# every level (>= 64); snapkv misses it at the lowest level; tiers(host=64MiB) never
# reads its tier and measures a hair better than bf16 (4 + .55 * 12 = 10.6).
SWEEP = {
    "bf16": [(0.5, 0.045), (1.5, 0.08), (3.0, 0.15)],
    "int8": [(0.3, 0.04), (0.6, 0.06), (1.4, 0.085)],
    "int4": [(0.2, 0.045), (0.4, 0.07), (0.9, 0.095)],
    "snapkv(budget=0.25)": [(1.2, 0.05), (2.0, 0.06), (4.0, 0.2)],
    "tiers(host=64MiB)": [(0.45, 0.045), (1.45, 0.08), (3.0, 0.15)],
}
SWEEP_PEAK_MIB = {"bf16": 64, "int8": 32, "int4": 16, "snapkv(budget=0.25)": 12,
                  "tiers(host=64MiB)": 64}


def level_rows(cell_id: str, kv: str, ttft_s: float, gap_s: float, n: int = 8) -> list[dict]:
    rows = []
    for i in range(n):
        arrival = 0.01 * i
        times = [arrival + ttft_s + k * gap_s for k in range(4)]
        rows.append({"cell_id": cell_id, "model": "m", "kv": kv, "workload": "chat",
                     "request_id": f"r{i}", "arrival_s": arrival, "first_scheduled_s": arrival,
                     "finished_s": times[-1], "token_times_s": times, "num_prompt_tokens": 256,
                     "num_output_tokens": len(times), "ttft_s": ttft_s,
                     "tpot_s": gap_s, "e2e_s": times[-1] - arrival, "queue_s": 0.0,
                     "failed": False})
    return rows


def sweep_cells(kvs=None, failed: dict | None = None, model: str = "m",
                sweep: dict | None = None):
    """(record, rows) per configuration and level; ``failed``: kv -> level values whose
    cell failed (stored as failed, as the bench does)."""
    sweep, failed, out = sweep or SWEEP, failed or {}, []
    for kv in kvs or sweep:
        for level, (ttft_s, gap_s) in zip(LEVELS, sweep[kv]):
            cell_id = f"{model}-{kv}-chat-{level:g}"
            rows = level_rows(cell_id, kv, ttft_s, gap_s)
            metrics = aggregate(rows, duration_s=1.0, slo=SWEEP_SLO)
            rate = metrics["output_tokens_per_s"] * (1 + level / 100)
            metrics.update(
                output_tokens_per_s=rate,
                output_throughput_windows_tok_s=[rate * (1 + 0.002 * (k % 2)) for k in range(10)],
                peak_kv_resident_bytes=SWEEP_PEAK_MIB[kv] << 20, kv_capacity_tokens=4096,
                concurrency_max=level, concurrency_mean=level * 0.8, weight_bytes=270 << 20,
                tiers={"host": {"bytes_read": 0, "num_hits": 0}} if "tiers" in kv else {},
                num_evicted_tokens=100 if "snapkv" in kv else None)
            record = _record(cell_id, kv, "workload", metrics, workload="chat")
            record.model = model
            record.load = {"label": f"closed:{level:g}", "kind": "closed", "value": level}
            if level in failed.get(kv, ()):
                record.status, record.error = "failed", "TimeoutError: level timed out"
                record.metrics, rows = {}, []
            out.append((record, rows))
    return out


def write_run(path: Path, cells, slo: dict | None = None, name: str = "sweep") -> Path:
    return store_run(path, cells, {"name": name, "slo": slo or {},
                                   "engine": {"kv_memory": "128MiB"}})


@pytest.fixture
def sweep_run(tmp_path) -> Path:
    return write_run(tmp_path / "sweep", sweep_cells(), SWEEP_SLO)
