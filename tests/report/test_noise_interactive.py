"""Speed with its noise (throughput intervals, parts that never acted, simplicity) and
the interactive figures of report.html on a hand-made load sweep."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from kvmap.report.analysis import analyze
from kvmap.report.html import render
from kvmap.report.interactive import family, load_figure, tradeoff_figure
from kvmap.report.loader import load_run
from kvmap.report.noise import (complexity, idle_parts, t975, throughput_ci,
                                windows_from_rows, without)
from kvmap.runs.workload_metrics import WorkloadMetrics

W = WorkloadMetrics.read


def test_throughput_interval_from_windows_and_from_rows():
    windows = [90.0, 110.0] * 5
    lo, hi = throughput_ci(W({"output_tokens_per_s": 100.0,
                              "output_throughput_windows_tok_s": windows}), [])
    half = t975(9) * np.std(windows, ddof=1) / math.sqrt(10)
    assert (lo, hi) == pytest.approx((100 - half, 100 + half))
    assert t975(9) == pytest.approx(2.262, abs=0.005)
    assert throughput_ci(W({"output_tokens_per_s": 100.0}), []) is None      # not measured
    # recomputed from token times: 10 tokens a second, evenly spread over 10 s
    rows = [{"arrival_s": 0.0, "token_times_s": [0.05 + 0.1 * k for k in range(100)]}]
    assert windows_from_rows(rows) == pytest.approx([10.0 * 10 / 9.95] * 10, rel=0.02)


def test_parts_that_never_acted():
    assert idle_parts("tiers(host=64MiB)", W({"tiers": {"host": {"bytes_read": 0,
                                                                 "num_hits": 0}}})) == ["tiers"]
    assert idle_parts("tiers(host=64MiB)", W({"tiers": {"host": {"bytes_read": 4096,
                                                                 "num_hits": 1}}})) == []
    assert idle_parts("snapkv(budget=0.25)+int8", W({"num_evicted_tokens": 0})) == ["policy"]
    assert idle_parts("snapkv(budget=0.25)", W({})) == []            # not recorded: unknown
    assert idle_parts("snapkv(budget=0.25)", W({"num_compressions": 0})) == ["policy"]
    assert idle_parts("snapkv(budget=0.25)", W({"num_compressions": 3,
                                                 "num_evicted_tokens": 0})) == ["policy"]
    assert idle_parts("int8", W({"num_evicted_tokens": 0})) == []    # a codec always acts
    assert without("snapkv(budget=0.25)+int8", ["policy"], "bf16") == "int8"
    assert without("tiers(host=64MiB)", ["tiers"], "bf16") == "bf16"
    assert [complexity(kv, "bf16") for kv in ("bf16", "int8", "snapkv(budget=0.25)+int8",
                                               "h2o(budget=0.2)+int8+tiers(host=1GiB)")] \
        == [0, 1, 2, 3]


def test_interactive_map_and_load_curves(sweep_run):
    a = analyze(load_run(sweep_run))
    assert {family(c) for c in a.configs} == {"baseline", "codec", "selection policy",
                                              "offload tier"}
    fig = tradeoff_figure(a.configs, a.recommendation.choice)
    points = [t for t in fig.data if t.mode == "markers+text"]
    assert {t.name for t in points} >= {"baseline", "codec"}       # one trace per family
    int8 = next(t for t in points if "int8" in "".join(t.customdata))
    k = list(int8.customdata).index("cfg-int8")
    assert "SLA capacity 40.0 concurrent" in int8.hovertext[k]
    assert '<a href="#cfg-int8">int8</a>' in int8.text[k]
    assert int8.error_y.array is not None                          # throughput interval
    curves = load_figure(a.configs, a.constraints.slo, "chat")
    lines = [t for t in curves.data if t.name == "int8"]
    assert len(lines) == 3 and list(lines[0].x) == [4.0, 16.0, 64.0]
    html = render(a)
    assert html.count("plotly.js v") == 1                          # the bundle once
    assert html.count("Plotly.newPlot") == 2                       # map + load curves
    assert 'id="map-interactive"' in html and 'id="load-chat"' in html
    assert "Load curves and SLA capacity" in html and 'id="fig-load-chat"' in html
    assert "≥ top level (64 concurrent)" in html
    assert set(re.findall(r'href="#(cfg-[a-z0-9-]+)"', html)) <= set(
        re.findall(r'<tr id="(cfg-[a-z0-9-]+)"', html))           # every link has its row


def test_a_failed_level_is_a_gap_in_the_drawn_curve(tmp_path):
    from tests.report.conftest import SWEEP_SLO, sweep_cells, write_run
    run = write_run(tmp_path / "r", sweep_cells(["bf16", "int8"], failed={"int8": (16.0,)}),
                    SWEEP_SLO)
    a = analyze(load_run(run))
    curves = load_figure(a.configs, a.constraints.slo, "chat")
    tput = next(t for t in curves.data if t.name == "int8")
    assert tput.y[1] is None and tput.connectgaps is False
    assert "failed" in render(a)


def _bound(cells, running: dict[str, int]):
    """Every configuration fills the same 64 MiB pool at its top level (memory binds)
    and holds ``running[kv]`` sequences there."""
    top = max(c[0].load["value"] for c in cells)
    for record, _ in cells:
        if record.load["value"] == top:
            record.metrics.update(peak_kv_resident_bytes=64 << 20, num_pool_full_steps=7,
                                  concurrency_max=running[record.kv])
    return cells


def test_where_memory_binds_the_map_adds_kv_per_running_sequence(tmp_path):
    from tests.report.conftest import SWEEP_SLO, _tasks, sweep_cells, write_run
    from kvmap.report.plots import bound_workload, tradeoff_map
    cells = _bound(sweep_cells(["bf16", "int8"]), {"bf16": 16, "int8": 30})
    cells += [(t, []) for kv, drop in (("bf16", 0.0), ("int8", 0.5))
              for t in _tasks(kv, drop, [1, 1, 1, 1], 30 << 20)]
    a = analyze(load_run(write_run(tmp_path / "bound", cells, SWEEP_SLO)))
    by = {c.name: c for c in a.configs}
    # the pool is full for both: peak bytes are equal and hide int8's saving ...
    assert by["bf16"].peak_kv_bytes == by["int8"].peak_kv_bytes == 64 << 20
    # ... which the cost of one running sequence shows
    assert by["bf16"].kv_per_seq_bytes == pytest.approx((64 << 20) / 16)
    assert by["int8"].kv_per_seq_bytes == pytest.approx((64 << 20) / 30)
    assert bound_workload(a.configs) == "chat"
    fig = tradeoff_figure(a.configs, a.recommendation.choice)
    # titles in two lines (three one-line titles overlap at 1,400 pixels)
    assert [ann.text.split("<br>")[0].split(" (")[0] for ann in fig.layout.annotations][:3] \
        == ["memory vs accuracy", "where memory binds", "speed vs tail latency on chat"]
    assert fig.layout.xaxis2.title.text == "peak KV per running sequence<br>(MiB), chat"
    int8 = next(t for t in fig.data if t.mode == "markers+text" and t.xaxis == "x2"
                and "cfg-int8" in t.customdata)
    assert list(int8.x) == pytest.approx([64 / 30])
    assert tradeoff_map(a.configs, a.recommendation.choice)       # draws three panels


def test_where_memory_does_not_bind_the_map_keeps_two_panels(sweep_run):
    from kvmap.report.plots import bound_workload
    a = analyze(load_run(sweep_run))
    assert not any(c.memory_binds for c in a.configs)
    assert bound_workload(a.configs) is None
    fig = tradeoff_figure(a.configs, a.recommendation.choice)
    assert len(fig.layout.annotations) == 2
    assert fig.layout.xaxis2.title.text == "P99 time between tokens (ms)"
