"""``arrival: auto``: the SLA capacity found by search, on a hand-made engine with a known
answer (a single server of fixed service time fed by a seeded Poisson stream), through
the real runner, store and report; settings refused with the bad value named."""
from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from kvmap.bench.cell_backend import CellBackend, CellResult
from kvmap.runs.search import (Probe, SearchSettings, grid, next_probe, result,
                                         slo_attainment, verdict, wilson)
from kvmap.runs.record import CellRecord
from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import ScenarioError, load_scenario
from kvmap.bench.search_backend import SEARCHES_FILE

SERVICE_S = 0.1                 # the hand-made engine: one request at a time, 0.1 s each
TTFT_LIMIT_S = 0.3
NUM_REQUESTS = 200


def ttfts(rate: float | None, concurrency: int | None, n: int, seed: int = 7) -> np.ndarray:
    """TTFTs of the single server: an open loop at ``rate`` on a seeded Poisson stream
    (the same exponentials at every rate, so waits grow with the rate), or a closed
    loop of ``concurrency`` (each request waits for the c - 1 ahead of it)."""
    if rate is None:
        return np.full(n, concurrency * SERVICE_S)
    gaps = np.random.default_rng(seed).exponential(size=n) / rate
    wait, out = 0.0, []
    for i, gap in enumerate(gaps):
        wait = 0.0 if i == 0 else max(0.0, wait + SERVICE_S - gap)   # Lindley
        out.append(wait + SERVICE_S)
    return np.array(out)


def known_capacity(target: float) -> float:
    """The highest rate (to 1e-4 req/s) whose attainment meets ``target``."""
    lo, hi = 0.1, 1 / SERVICE_S
    for _ in range(60):
        mid = (lo + hi) / 2
        share = np.mean(ttfts(mid, None, NUM_REQUESTS) <= TTFT_LIMIT_S)
        lo, hi = (mid, hi) if share >= target else (lo, mid)
    return lo


class ModelBackend(CellBackend):
    """Cells answered by the hand-made engine; ``fail`` rates are stored as failed."""

    name = "model"

    def __init__(self, fail: tuple[float, ...] = ()):
        self.fail, self.ran = fail, []

    def run(self, todo, store, on_fraction):
        for ordinal, cell in todo:
            load = cell.workload.load
            n = cell.workload.options["num_requests"]
            rate = load["value"] if load["kind"] == "poisson" else None
            self.ran.append(load["label"])
            if rate is not None and any(math.isclose(rate, f) for f in self.fail):
                yield CellResult(ordinal, cell, CellRecord.of_cell(
                    cell, status="failed", error="boom"), [])
                continue
            t = ttfts(rate, None if rate else int(load["value"]), n)
            arrival = np.cumsum(np.random.default_rng(7).exponential(size=n) / rate) \
                if rate else np.zeros(n)
            rows = [{"request_id": str(i), "arrival_s": float(a), "finished_s": float(a + x),
                     "token_times_s": [float(a + x)], "num_output_tokens": 1}
                    for i, (a, x) in enumerate(zip(arrival, t))]
            # a closed loop keeps the server busy: n requests take n services
            span = float(max(a + x for a, x in zip(arrival, t)) - arrival[0]) if rate \
                else n * SERVICE_S
            metrics = {"requests_per_s": n / span, "e2e_s": {"mean": float(t.mean())},
                       "num_requests": n, "output_tokens_per_s": n / span,
                       "concurrency_mean": float(t.sum() / span),
                       "slo_attainment": slo_attainment(rows, cell.slo)}
            record = CellRecord.of_cell(cell, metrics=metrics)
            yield CellResult(ordinal, cell, record, [])


SCENARIO = """
    models: ["dummy:tiny"]
    engine: {kv_memory: 1MiB, block_size: 4, max_num_seqs: 16}
    kv: [fp32]
    workloads:
      - {name: s1, kind: synthetic, num_requests: %d, prompt_len: 8, output_len: 1,
         arrival: auto, search: {attainment: 0.95, tolerance: 0.05, levels: 3, max_probes: 12}}
    slo: ttft_p99=300ms
    """ % NUM_REQUESTS


def test_search_finds_the_known_capacity_through_runner_and_report(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    scenario = load_scenario(path)
    assert scenario.cells() == [] and len(scenario.searches()) == 1
    backend = ModelBackend()
    run = run_scenario(scenario, tmp_path / "run", backend=backend, show_progress=False)
    assert backend.ran[:2] == ["closed:1", "closed:16"]          # serial, saturated
    truth = known_capacity(0.95)
    found = json.loads((tmp_path / "run" / SEARCHES_FILE).read_text())
    (entry,) = found.values()
    lo, hi = entry["result"]["bracket_req_s"]
    assert lo <= truth < hi and hi / lo - 1 <= 0.05 + 1e-9, (lo, truth, hi)
    assert entry["result"]["status"] in ("bracketed", "indeterminate")
    roles = [p["role"] for p in entry["probes"]]
    assert roles[:2] == ["serial", "saturated"] and "bisect" in roles
    # the report reads the capacity from the probes, levels only (not the range runs)
    from kvmap.report.analysis import analyze
    from kvmap.report.loader import load_run
    analysis = analyze(load_run(tmp_path / "run"))
    (config,) = analysis.configs
    assert config.capacity.value == pytest.approx(lo) and config.capacity.ci == (lo, hi)
    assert all(p.kind == "poisson" for p in config.curves["s1"])
    # its headline figures are the saturated run's: the one load every configuration shares
    saturated = next(c for c in load_run(tmp_path / "run").cells
                     if (c.load.get("search") or {}).get("role") == "saturated")
    assert config.workloads["s1"] is not None
    assert config.workloads["s1"]["output_tokens_per_s"] == \
        saturated.metrics["output_tokens_per_s"]
    # resumed: every probe is stored, none runs again
    again = ModelBackend()
    run_scenario(scenario, tmp_path / "run", backend=again, show_progress=False)
    assert again.ran == [] and run.num_ran == len(roles)


def test_a_failed_probe_is_stored_and_the_search_goes_on_below(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    scenario = load_scenario(path)
    top = grid(1 / SERVICE_S, 1 / SERVICE_S, 3)
    backend = ModelBackend(fail=(top[0],))
    run_scenario(scenario, tmp_path / "run", backend=backend, show_progress=False)
    (entry,) = json.loads((tmp_path / "run" / SEARCHES_FILE).read_text()).values()
    failed = [p for p in entry["probes"] if p["status"] == "failed"]
    assert [p["label"] for p in failed] == [f"poisson:{top[0]:g}"]
    lo, hi = entry["result"]["bracket_req_s"]
    assert lo <= known_capacity(0.95) < hi and hi <= top[0]


def test_verdicts_and_intervals():
    low, high = wilson(32, 32)
    assert high == 1.0 and 0.85 < low < 0.9          # 32 of 32: not yet 99% for sure
    att = {"min": {"key": "ttft_p99_s", "share": 1.0, "attained": 32, "n": 32}}
    assert verdict(att, 0.99)[0] == "indeterminate"
    assert verdict(att, 0.8)[0] == "pass"
    att = {"min": {"key": "ttft_p99_s", "share": 0.5, "attained": 16, "n": 32}}
    assert verdict(att, 0.99)[0] == "fail"


def test_over_saturated_level_misses_without_failing():
    record = {"status": "ok", "load": {"kind": "poisson", "value": 3.0, "label": "poisson:3",
                                       "search": {"role": "level"}},
              "metrics": {"stopped_early": {"reason": "over-saturated"},
                          "slo_attainment": {"min": {"key": "k", "share": 1.0,
                                                     "attained": 8, "n": 8}}}}
    probe = Probe.of(record, 0.99)
    assert probe.ok and probe.over_saturated and not probe.passes(0.99)
    assert probe.verdict == "fail"


def test_every_level_passing_is_top_and_range_failure_stops():
    settings = SearchSettings(levels=2, max_probes=4)
    serial = Probe("serial", None, True, requests_per_s=1.0)
    saturated = Probe("saturated", None, True, requests_per_s=4.0)
    levels = [Probe("level", r, True, share=1.0, verdict="pass") for r in grid(1.0, 4.0, 2)]
    assert next_probe([serial, saturated, *levels], settings, 32, 16) is None
    assert result([serial, saturated, *levels], settings).status == "top"
    broken = Probe("saturated", None, False)
    assert next_probe([serial, broken], settings, 32, 16) is None


@pytest.mark.parametrize("search, message", [
    ("{attainment: 1.5}", "search.attainment=1.5 must be in (0, 1]"),
    ("{attainment: 0}", "search.attainment=0 must be in (0, 1]"),
    ("{tolerance: 0}", "search.tolerance=0 must be a positive fraction"),
    ("{tolerance: -0.1}", "search.tolerance=-0.1 must be a positive fraction"),
    ("{levels: 9, max_probes: 4}", "search.levels=9 is more than"),
    ("{step: 2}", "unknown key 'step'"),
])
def test_bad_search_settings_are_refused_naming_the_value(tmp_path, search, message):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO.replace(
        "{attainment: 0.95, tolerance: 0.05, levels: 3, max_probes: 12}", search)))
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(
            ")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        load_scenario(path)


def test_auto_needs_an_sla(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO.replace("slo: ttft_p99=300ms", "")))
    with pytest.raises(ScenarioError, match="needs an slo"):
        load_scenario(path)
