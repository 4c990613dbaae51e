"""``arrival: auto``: the SLA capacity by predict-then-verify, on a hand-made engine with a
known answer (a single server of fixed service time fed by a seeded Poisson stream),
through the real runner, store and report; the exact percentile tests; settings refused
with the bad value named."""
from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from kvmap.bench.cell_backend import CellBackend, CellResult
from kvmap.metrics.evidence import (KeyEvidence, decide, fit_boundary, needed_for_pass,
                                 pooled, quantile_interval)
from kvmap.runs.search import Probe, grid, next_probe, result, slo_attainment
from kvmap.runs.search_settings import SearchSettings
from kvmap.runs.record import CellRecord
from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import ScenarioError, load_scenario
from kvmap.bench.search_backend import SEARCHES_FILE

SERVICE_RATE = 10.0             # the hand-made engine: an M/M/1 server, 10 requests/s
TTFT_LIMIT_S = 1.0
QUANTILE = 0.9                  # the SLA: ttft_p90 <= 1 s
NUM_REQUESTS = 40


def ttfts(rate: float | None, concurrency: int | None, n: int, seed: int = 7) -> np.ndarray:
    """TTFTs of the hand-made server: in an open loop at ``rate``, the M/M/1 sojourn time
    in steady state, Exp(SERVICE_RATE - rate), drawn independently (requests whose times
    do not share a queue: the tests' binomial evidence is exact); in a closed loop of
    ``concurrency``, each request waits for the c - 1 ahead of it."""
    if rate is None:
        return np.full(n, concurrency / SERVICE_RATE)
    if rate >= SERVICE_RATE:
        return np.full(n, np.inf)
    return np.random.default_rng(seed).exponential(size=n) / (SERVICE_RATE - rate)


def known_capacity(q: float = QUANTILE) -> float:
    """The rate at which P(TTFT <= limit) = 1 - exp(-(mu - rate) limit) equals ``q``."""
    return SERVICE_RATE + math.log(1 - q) / TTFT_LIMIT_S


class ModelBackend(CellBackend):
    """Cells answered by the hand-made engine; ``fail`` rates are stored as failed."""

    name = "model"

    def __init__(self, fail: tuple[float, ...] = (), over_at: float | None = None):
        self.fail, self.ran, self.over_at = fail, [], over_at

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
            seed = 7 + int(cell.workload.options.get("seed", 0))   # an extension: fresh
            t = ttfts(rate, None if rate else int(load["value"]), n, seed)
            arrival = np.cumsum(np.random.default_rng(seed).exponential(size=n) / rate) \
                if rate else np.zeros(n)
            rows = [{"request_id": str(i), "arrival_s": float(a), "finished_s": float(a + x),
                     "token_times_s": [float(a + x)], "num_output_tokens": 1}
                    for i, (a, x) in enumerate(zip(arrival, t))]
            # a closed loop keeps the server busy: n requests take n services
            span = float(n / rate) if rate else n / SERVICE_RATE
            metrics = {"requests_per_s": n / span, "e2e_s": {"mean": float(t.mean())},
                       "num_requests": n, "output_tokens_per_s": n / span,
                       "concurrency_mean": float(t.sum() / span),
                       "slo_attainment": slo_attainment(rows, cell.slo)}
            if self.over_at is not None and rate is not None and rate >= self.over_at:
                metrics["stopped_early"] = {"reason": "over-saturated"}
            record = CellRecord.of_cell(cell, metrics=metrics)
            yield CellResult(ordinal, cell, record, rows)


SCENARIO = """
    models: ["dummy:tiny"]
    engine: {kv_memory: 1MiB, block_size: 4, max_num_seqs: 16}
    kv: [fp32]
    workloads:
      - {name: s1, kind: synthetic, num_requests: %d, prompt_len: 8, output_len: 1,
         arrival: auto, search: {tolerance: 0.35, max_probes: 16, max_level_requests: 400}}
    slo: ttft_p90=1s
    """ % NUM_REQUESTS


def predictor(error: float):
    """A simulator of the hand-made server that is ``error`` (relative) optimistic about
    its service rate: its predicted SLA attainment at a rate, as the search reads it."""
    def predict(cell, record, rows):
        load = cell.workload.load
        if load["kind"] != "poisson":
            return {"metrics": {}}
        mu = SERVICE_RATE * (1 + error)
        share = 1 - math.exp(-max(mu - load["value"], 0.0) * TTFT_LIMIT_S)
        return {"metrics": {}, "slo_attainment": {"keys": {"ttft_p90_s": {
            "share": share, "quantile": QUANTILE}}}}
    return predict


@pytest.mark.parametrize("error", [0.0, 0.05])
def test_search_finds_the_known_capacity_through_runner_and_report(tmp_path, error):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    scenario = load_scenario(path)
    assert scenario.cells() == [] and len(scenario.searches()) == 1
    backend = ModelBackend()
    run = run_scenario(scenario, tmp_path / "run", backend=backend, show_progress=False,
                       predict=predictor(error=error))
    assert backend.ran[:2] == ["closed:1", "closed:16"]          # serial, saturated
    truth = known_capacity()
    found = json.loads((tmp_path / "run" / SEARCHES_FILE).read_text())
    (entry,) = found.values()
    res = entry["result"]
    lo, hi = res["bracket_req_s"]
    # decided: a decided pass below the truth, a decided fail above it, within tolerance
    assert res["status"] == "decided", res
    assert lo <= truth < hi and hi / lo - 1 <= 0.35 + 0.01, (lo, truth, hi)
    assert lo <= res["capacity_req_s"] <= hi
    roles = [p["role"] for p in entry["probes"]]
    assert roles[:2] == ["serial", "saturated"]
    # the report's typed reading of the same file names every key the search wrote
    from kvmap.runs.search_record import read_searches
    (typed,) = read_searches(tmp_path / "run").values()
    assert typed.result.capacity_req_s == res["capacity_req_s"] and typed.result.extra == {}
    assert [p.role for p in typed.probes] == roles and typed.extra == {}
    assert all(p.extra == {} for p in typed.probes)
    if error == 0:
        # a prediction on the mark is verified by two levels, in fewer requests than a
        # ladder of the same resolution made to decide
        assert res["num_requests"] < ladder_requests(entry), res
    else:
        # 5% optimistic: the first level lands near the boundary, and sequential sampling
        # draws more requests there until it decides
        assert "extend" in roles
    assert res["requests_to_decide_a_pass"] == needed_for_pass(QUANTILE)
    # the prediction is stored beside the verified capacity
    assert res["predicted_req_s"] == pytest.approx(truth * (1 + error), rel=0.05)
    # the report reads the capacity from the probes, levels only (not the range runs)
    from kvmap.report.analysis import analyze
    from kvmap.report.loader import load_run
    analysis = analyze(load_run(tmp_path / "run"))
    (config,) = analysis.configs
    assert config.capacity.value == pytest.approx(res["capacity_req_s"])
    assert config.capacity.ci == (lo, hi)
    assert all(p.kind == "poisson" for p in config.curves["s1"])
    # its headline figures are the saturated run's: the one load every configuration shares
    saturated = next(c for c in load_run(tmp_path / "run").cells
                     if (c.load.get("search") or {}).get("role") == "saturated")
    assert config.workloads["s1"] is not None
    assert config.workloads["s1"].output_tokens_per_s == \
        saturated.metrics["output_tokens_per_s"]
    # resumed: every probe is stored, none runs again
    again = ModelBackend()
    run_scenario(scenario, tmp_path / "run", backend=again, show_progress=False,
                 predict=predictor(error=error))
    assert again.ran == [] and run.num_ran == len(roles)




def requests_to_decide_at(share: float, q: float = QUANTILE, limit: int = 100_000) -> int:
    """The requests a level whose true share is ``share`` needs before its test decides
    (at the expected count): what a fixed ladder must spend on that rung."""
    n = 1
    while n < limit and decide(round(share * n), n, q) == "undecided":
        n = math.ceil(n * 1.1) + 1
    return n


def ladder_requests(entry: dict) -> int:
    """The ladder the search replaces, made to decide: the same serial and saturated runs,
    rungs ``grid(X1, Xmax, 3)`` climbed to the first miss, then bisection to the same
    tolerance, each probe with the requests its decision needs at its true share."""
    serial, saturated = entry["probes"][0], entry["probes"][1]
    total = serial["num_requests"] + saturated["num_requests"]

    def share(rate: float) -> float:
        return 1 - math.exp(-max(SERVICE_RATE - rate, 0.0) * TTFT_LIMIT_S)
    lo = hi = None
    for rate in grid(SERVICE_RATE, SERVICE_RATE, 3):
        total += requests_to_decide_at(share(rate))
        if share(rate) < QUANTILE:
            hi = rate
            break
        lo = rate
    while lo is not None and hi is not None and hi / lo - 1 > entry["result"]["tolerance"]:
        mid = math.sqrt(lo * hi)
        total += requests_to_decide_at(share(mid))
        lo, hi = (mid, hi) if share(mid) >= QUANTILE else (lo, mid)
    return total


def test_a_prediction_places_the_first_level_and_the_search_verifies_it(tmp_path):
    settings = SearchSettings(tolerance=0.15, max_probes=14)
    serial = Probe("serial", None, True, requests_per_s=2.0, num_requests=4)
    saturated = Probe("saturated", None, True, requests_per_s=9.0, num_requests=40)
    step = next_probe([serial, saturated], settings, 40, 16, predicted=4.2)
    # half the tolerance below the prediction: where a pass is expected and cheap to decide
    assert (step.role, step.arrival) == ("level", f"poisson:{4.2 / math.sqrt(1.15):.3g}")
    # without a prediction: the middle of the ladder's range
    step = next_probe([serial, saturated], settings, 40, 16)
    assert step.arrival == f"poisson:{float(f'{math.sqrt(2.0 * 9.0):.3g}'):g}"


def _ev(within: int, n: int, q: float = QUANTILE, key: str = "ttft_p90_s") -> KeyEvidence:
    return KeyEvidence(key, q, within, n, "requests")


def test_an_undecided_level_is_extended_with_fresh_requests():
    settings = SearchSettings(tolerance=0.15, max_probes=14, max_level_requests=120)
    serial = Probe("serial", None, True, requests_per_s=2.0, num_requests=4)
    saturated = Probe("saturated", None, True, requests_per_s=9.0, num_requests=40)
    undecided = Probe("level", 4.0, True, evidence=(_ev(39, 40),), num_requests=40)
    assert decide(39, 40, QUANTILE) == "undecided"
    step = next_probe([serial, saturated, undecided], settings, 40, 16)
    assert (step.role, step.arrival, step.seed_offset) == ("extend", "poisson:4", 1)
    # at its cap a level is left undecided and the search moves on
    more = [Probe("extend", 4.0, True, evidence=(_ev(36, 40),), num_requests=40)] * 2
    step = next_probe([serial, saturated, undecided, *more], settings, 40, 16)
    assert step.role != "extend"
    # a share that sits on its quantile is not worth drawing for: move on at once
    on_it = Probe("level", 4.0, True, evidence=(_ev(36, 40),), num_requests=40)
    assert next_probe([serial, saturated, on_it], settings, 40, 16).role != "extend"


def test_monotone_pooling_decides_with_fewer_requests_per_level():
    # 30 of 30 within at 1 req/s and 30 of 30 at 1.5: neither decides a P90 alone (36
    # needed), the lower one does pooled with the higher (60 values)
    levels = [(1.0, [_ev(30, 30)]), (1.5, [_ev(30, 30)]), (3.0, [_ev(10, 30)])]
    assert decide(30, 30, QUANTILE) == "undecided"
    assert pooled(levels, 1.0) == "pass"
    assert pooled(levels, 3.0) == "fail"
    # a higher level that misses its quantile is not pooled into a lower one's pass
    assert pooled([(1.0, [_ev(30, 30)]), (1.5, [_ev(20, 30)])], 1.0) == "undecided"
    assert 1.5 < fit_boundary(levels) < 3.0


def test_a_percentile_sla_at_a_known_distribution_is_decided_correctly():
    rng = np.random.default_rng(3)
    values = rng.exponential(size=2000)                       # P99 = ln(100) = 4.605
    truth = math.log(100)
    est, low, high = quantile_interval(list(values), 0.99)
    assert low < truth < high and abs(est - truth) < 0.6
    within = lambda limit: int(np.sum(values <= limit))      # noqa: E731
    assert decide(within(truth * 1.5), len(values), 0.99) == "pass"
    assert decide(within(truth / 1.5), len(values), 0.99) == "fail"
    # 100 values cannot decide a P99 pass however good they are; 368 can
    assert needed_for_pass(0.99) == 368
    assert decide(100, 100, 0.99) == "undecided" and decide(368, 368, 0.99) == "pass"
    # TBT counts every token gap: a 64-token request gives 63 values
    rows = [{"request_id": str(i), "arrival_s": 0.0, "finished_s": 6.4,
             "token_times_s": [0.1 * (k + 1) for k in range(64)]} for i in range(8)]
    att = slo_attainment(rows, {"tbt_p99_s": 0.2, "ttft_p90_s": 1.0})
    assert att["keys"]["tbt_p99_s"]["n"] == 8 * 63
    assert att["keys"]["tbt_p99_s"]["verdict"] == "pass"
    assert att["keys"]["ttft_p90_s"]["n"] == 8
    assert att["keys"]["ttft_p90_s"]["verdict"] == "undecided"


def test_over_saturated_level_fails_without_failing_the_cell():
    record = {"cell_id": "c", "kind": "workload", "model": "m", "kv": "bf16",
              "status": "ok", "load": {"kind": "poisson", "value": 3.0, "label": "poisson:3",
                                       "search": {"role": "level"}},
              "metrics": {"stopped_early": {"reason": "over-saturated"},
                          "slo_attainment": {"keys": {"k": {"share": 1.0, "within": 8,
                                                            "n": 8, "quantile": 0.9}},
                                             "min": {"key": "k", "share": 1.0}}}}
    probe = Probe.of(record, 0.99)
    assert probe.ok and probe.over_saturated and probe.verdict == "fail"


def test_every_level_passing_is_top_and_range_failure_stops():
    settings = SearchSettings(levels=2, max_probes=4)
    serial = Probe("serial", None, True, requests_per_s=1.0)
    saturated = Probe("saturated", None, True, requests_per_s=4.0)
    levels = [Probe("level", r, True, evidence=(_ev(400, 400),), num_requests=400)
              for r in (1.5, 2.4, 3.84, 6.0)]
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
    ("{max_level_requests: 0}", "search.max_level_requests=0 must be an integer >= 1"),
    ("{step: 2}", "unknown key 'step'"),
])
def test_bad_search_settings_are_refused_naming_the_value(tmp_path, search, message):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO.replace(
        "{tolerance: 0.35, max_probes: 16, max_level_requests: 400}", search)))
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(
            ")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        load_scenario(path)


def test_auto_needs_an_sla(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO.replace("slo: ttft_p90=1s", "")))
    with pytest.raises(ScenarioError, match="needs an slo"):
        load_scenario(path)
