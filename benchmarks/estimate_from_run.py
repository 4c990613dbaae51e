"""The bench estimator's calibration refitted on a real ``kvmap bench`` run: every cell of
the run estimated again by today's estimator at the sizes it ran (its stored budget plan),
beside the wall time it took, and the two speed terms of the calibration scaled so the
estimate meets the run:

    actual - fixed  ~  a x prefill + b_codec x decode        (least squares, per cell)

``fixed``: the parts the calibration measured in seconds (start, build, probes, the warm
worker), kept; ``a`` scales the prefill rates (``e_prefill``, ``e_attn``); ``b_fp`` the
baseline's decode terms (the step overhead, ``e_stream``, ``e_batch``, ``e_kv``) and
``b_codec / b_fp`` each codec's decode factor. Open-loop cells (a level of a search: its
time is its schedule, N / rate) and cells without an estimate are left out of the fit.

Why from a run: the microbenchmarks of ``estimate_calibration.py`` time a few requests
for seconds each, and on a shared 2-core machine a burst of other work lands in them
(two refits on 2026-12-04 at load 2.3-2.9 gave e_prefill 270,916 and a 63 ms batch-1 step
where the bench's own cells decoded at 31 ms). A full run's cells are minutes of the
very work the estimate is for. Its limits: the run's own load is in the fit (the record
keeps the run's load average), and only the codecs the run had are refitted.

    PYTHONPATH=src .venv/bin/python benchmarks/estimate_from_run.py RUN_DIR [--ship]

Prints per family estimate before, after and actual; writes
``benchmarks/results/estimate_from_run-<class>-<dtype>-<time>.json``, and the calibration
beside the hardware profile (``--ship``: also under ``src/kvmap/perf/calibrations/``).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIXED = ("start", "build", "probes", "worker")


def _lstsq2(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(a, b) minimising sum (y - a x1 - b x2)^2 over rows (x1, x2, y); a coordinate
    falls back to 1.0 when its column is empty."""
    s11 = sum(x1 * x1 for x1, _, _ in rows)
    s22 = sum(x2 * x2 for _, x2, _ in rows)
    s12 = sum(x1 * x2 for x1, x2, _ in rows)
    s1y = sum(x1 * y for x1, _, y in rows)
    s2y = sum(x2 * y for _, x2, y in rows)
    det = s11 * s22 - s12 * s12
    if s11 <= 0 or s22 <= 0 or abs(det) < 1e-12 * s11 * s22:
        return (s1y / s11 if s11 > 0 else 1.0), (s2y / s22 if s22 > 0 else 1.0)
    return (s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det


def run_cells(run_dir: Path):
    """``(specs by cell id, records, estimator, run.json)`` of a stored run, at its sizes."""
    from kvmap.bench.budget import replay
    from kvmap.bench.estimate import Estimator, estimate_run, search_range_cells
    from kvmap.bench.scenario import load_scenario
    from kvmap.hardware import profile
    from kvmap.runs.store import RunStore
    store = RunStore(run_dir)
    meta = store.metadata()
    scenario = load_scenario(run_dir / "scenario.yaml")
    hw = profile()
    est = Estimator(hw.rates, warm=True, slowdown=1.0, hw=hw)    # the calibration's speed
    stored = (meta.get("preflight") or {}).get("budget")
    every = scenario.cells() + scenario.searches()
    if stored:
        scenario = replay(scenario, stored, lambda s: estimate_run(s, est),
                          lambda w: est.pool_requests(every, w)).scenario
    specs = {c.cell_id: c for c in scenario.cells()}
    for template in scenario.searches():
        specs.update({c.cell_id: c for c in search_range_cells(scenario, template)})
    return specs, store.cells(), est, meta


def fit(run_dir: Path):
    from kvmap.bench.estimate import estimate_cells
    specs, records, est, meta = run_cells(run_dir)
    ran = [r for r in records if r.cell_id in specs and r.ok and (r.estimate or {})
           .get("actual_s")]
    cells = [specs[r.cell_id] for r in ran]
    dtypes = {c.model.dtype for c in cells if c.endpoint is None}
    dtype = "bf16" if "bf16" in dtypes else sorted(dtypes)[0]
    cal = est.calibration_of(dtype)
    before = estimate_cells(cells, est.rates, warm=True, calibration=cal)
    by_codec: dict[str, list] = defaultdict(list)
    rows = []
    for r, spec, e in zip(ran, cells, before.cells):
        if "schedule_wait" in e.parts:
            continue
        fixed = sum(e.parts.get(k, 0.0) for k in FIXED)
        y = r.estimate["actual_s"] - fixed
        codec = est.codec_of(spec) if spec.endpoint is None else "other"
        family = "fp" if codec in ("fp32", "bf16", "fp16") else codec
        by_codec[family].append((e.parts["prefill"], e.parts["decode"], y))
        rows.append((e.parts["prefill"], e.parts["decode"], y))
    a, b = _lstsq2(rows)
    scales = {}
    for codec, cr in by_codec.items():      # each codec's decode at the fitted prefill scale
        dec = sum(x2 for _, x2, _ in cr)
        scales[codec] = sum(y - a * x1 for x1, _, y in cr) / dec if dec > 0 else b
    b = scales.get("fp", b)                 # the baseline's decode; the codecs relative to it
    factors = {c: v / b for c, v in scales.items() if c != "fp"}
    return dict(ran=ran, cells=cells, before=before, a=a, b=b, factors=factors, est=est,
                meta=meta, cal=cal, dtype=dtype)


def refitted(cal, a: float, b: float, factors: dict[str, float], source: str):
    """``cal`` with prefill ``a`` and decode ``b`` times slower, each codec's factor x its
    own fitted ratio to the baseline's."""
    return replace(cal, e_prefill=cal.e_prefill / a, e_attn=cal.e_attn / a,
                   e_stream=cal.e_stream / b, e_batch=cal.e_batch / b, e_kv=cal.e_kv / b,
                   step_overhead_s_per_layer=cal.step_overhead_s_per_layer * b,
                   decode_factor=tuple(sorted({**dict(cal.decode_factor),
                                               **{c: cal.decode_factor_of(c) * f
                                                  for c, f in factors.items() if c != "fp"}
                                               }.items())),
                   source=source)


def by_family(estimate, ran) -> dict:
    out: dict = defaultdict(lambda: {"cells": 0, "estimate_s": 0.0, "actual_s": 0.0})
    for e, r in zip(estimate.cells, ran):
        f = out[e.family]
        f["cells"] += 1
        f["estimate_s"] += e.seconds
        f["actual_s"] += r.estimate["actual_s"]
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--ship", action="store_true")
    args = ap.parse_args()
    from kvmap.bench.estimate import estimate_cells
    from kvmap.perf.calibration import SHIPPED_DIR, store
    f = fit(args.run_dir)
    est, hw_dtype, cal = f["est"], f["dtype"], f["cal"]
    hw = est.hw                               # the profile the fit read
    record_name = f"estimate_from_run-{hw.machine_class}-{hw_dtype}"
    new = refitted(cal, f["a"], f["b"], f["factors"], source="")
    after = estimate_cells(f["cells"], est.rates, warm=True, calibration=new)
    fam_before = by_family(f["before"], f["ran"])
    fam_after = by_family(after, f["ran"])
    print(f"{args.run_dir} ({hw.machine_class}, {hw_dtype}): prefill x{f['a']:.3f}, "
          f"decode x{f['b']:.3f}, codec factors "
          + ", ".join(f"{c} {v:.3f}" for c, v in sorted(f["factors"].items())))
    print("| family | cells | estimate before s | estimate after s | actual s |")
    print("|---|---|---|---|---|")
    for name, fb in fam_before.items():
        print(f"| {name} | {fb['cells']} | {fb['estimate_s']:.0f} | "
              f"{fam_after[name]['estimate_s']:.0f} | {fb['actual_s']:.0f} |")
    total = {k: sum(x[k] for x in fam_after.values()) for k in ("estimate_s", "actual_s")}
    print(f"total after: estimate {total['estimate_s']:.0f} s, actual {total['actual_s']:.0f} s")
    meta = f["meta"]
    path = write_record(record_name, {"run_dir": str(args.run_dir), "dtype": hw_dtype},
                        {"prefill_scale": f["a"], "decode_scale": f["b"],
                         "codec_factors": f["factors"], "calibration_before": cal.to_dict(),
                         "calibration_after": new.to_dict(),
                         "families_before": fam_before, "families_after": fam_after,
                         "run_git": (meta.get("git") or {}).get("sha"),
                         "run_created_at": meta.get("created_at"),
                         "cells_fitted": len(f["ran"])})
    new = replace(new, source=os.path.relpath(path, ROOT))
    print(f"record: {path}")
    print(f"beside the profile: {store(new, hw)}")
    if args.ship:
        print(f"shipped: {store(new, hw, SHIPPED_DIR)}")


if __name__ == "__main__":
    main()
