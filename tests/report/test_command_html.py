"""``kvmap report`` and ``kvmap recommend`` on a hand-made run, through Typer."""
from __future__ import annotations

import base64
import json
import re

import pytest
import typer
from typer.testing import CliRunner

from kvmap.report.command import parse_percent, register


@pytest.fixture
def app():
    app = typer.Typer()
    register(app)
    return app


def invoke(app, *args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_report_writes_a_self_contained_html_with_every_plot(app, fake_run):
    result = invoke(app, "report", fake_run)
    assert result.exit_code == 0, result.output
    assert "trade-off map: fake" in result.output and "Recommended: bf16" in result.output
    html = (fake_run / "report.html").read_text()
    images = re.findall(r'<img class="plot" id="([^"]+)"[^>]*src="data:image/png;base64,([^"]+)"',
                        html)
    ids = {i for i, _ in images}
    assert {"fig-tradeoff", "fig-cdfs", "fig-position", "fig-heatmap-passkey",
            "fig-tiers"} <= ids
    for _, data in images:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    # offline: outside the inlined scripts nothing names a URL, no script or style is
    # fetched, and the plotly bundle is inlined once for the page's interactive figures
    outside = re.sub(r"<script[^>]*>.*?</script>", "", html, flags=re.S)
    assert "http://" not in outside and "https://" not in outside
    assert not re.search(r"<script[^>]*\ssrc=", html) and "<link" not in outside
    assert html.count("plotly.js v") == 1 and html.count("Plotly.newPlot") == 1
    assert 'id="map-interactive"' in html and 'id="cfg-int8"' in html
    for text in ("Pre-launch checklist", "operator launches per decode step", "Pareto",
                 "percentile bootstrap over requests", "Binding constraint"):
        assert text in html


def test_recommend_json_and_exit_codes(app, fake_run):
    result = invoke(app, "recommend", fake_run, "--slo", "ttft_p99=1s",
                    "--max-accuracy-drop", "30%", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["choice"] == "int8" and answer["feasible"]
    assert answer["runners_up"][0]["name"] == "bf16"
    assert {i["item"] for i in answer["checklist"]["int8"]} >= {"output stability (temperature "
                                                                 "0, alone vs in a mixed batch)"}
    result = invoke(app, "recommend", fake_run, "--slo", "ttft_p99=100ms")
    assert result.exit_code == 1
    assert "No measured configuration meets" in result.output
    assert "Closest miss: bf16" in result.output


def test_memory_objective_with_a_budget(app, fake_run):
    result = invoke(app, "recommend", fake_run, "--objective", "memory", "--kv-budget",
                    "30MiB", "--max-accuracy-drop", "50", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["choice"] == "int8"


@pytest.mark.parametrize("args, message", [
    (["--slo", "ttft=fast"], "not a duration"),
    (["--max-accuracy-drop", "lots"], "not a percentage"),
    (["--kv-budget", "huge"], "--kv-budget='huge'"),
    (["--objective", "cost"], "--objective='cost'"),
])
def test_bad_arguments_exit_2_naming_the_value(app, fake_run, args, message):
    result = invoke(app, "recommend", fake_run, *args)
    assert result.exit_code == 2
    assert "error:" in result.output and message in result.output


def test_not_a_run_directory(app, tmp_path):
    result = invoke(app, "report", tmp_path)
    assert result.exit_code == 2 and "not a kvmap run directory" in result.output


def test_parse_percent():
    assert parse_percent("1%") == 1.0 and parse_percent("0.5") == 0.5
    with pytest.raises(ValueError):
        parse_percent("-1%")


def test_a_configuration_whose_cells_all_failed(app, fake_run):
    from kvmap.runs.record import CellRecord
    from kvmap.runs.store import RunStore
    store = RunStore(fake_run)
    record = CellRecord(cell_id="int4-chat", kind="workload", model="m", dtype="bf16",
                        kv="int4", workload="chat", status="failed",
                        error="RuntimeError: out of memory", metrics={"peak_rss_bytes": 1})
    store.write_cell(record, [], 99)
    store.finalize()
    result = invoke(app, "report", fake_run)
    assert result.exit_code == 0, result.output
    html = (fake_run / "report.html").read_text()
    assert "Failed cells" in html and "RuntimeError: out of memory" in html
    assert "int4: every cell failed; not considered" in html


@pytest.mark.parametrize("status", ["ok", "failed"])
def test_a_run_with_tasks_only(app, tmp_path, status):
    """No workload cell (a task-only scenario, or every cell failed): the map still draws
    (its speed panel empty) and the command succeeds."""
    from tests.report.conftest import _tasks, store_run
    records = _tasks("bf16", 0.0, [1, 1, 1, 1], 1 << 20) + _tasks("int8", 0.5, [1, 0, 1, 1],
                                                                   1 << 19)
    for record in records:
        if status == "failed":
            record.fail("ValueError: no tokenizer")
            record.metrics = {}
    run = store_run(tmp_path / "run", [(r, []) for r in records], {"name": "tasks"})
    result = invoke(app, "report", run)
    assert result.exit_code == 0, result.output
    html = (run / "report.html").read_text()
    assert "data:image/png;base64," in html
    if status == "failed":
        assert "every cell failed" in html


def test_recommend_on_a_load_sweep_changes_with_the_slo(app, sweep_run):
    loose = json.loads(invoke(app, "recommend", sweep_run, "--json").output)
    assert loose["by_capacity"] and loose["choice"] == "int4"
    result = invoke(app, "recommend", sweep_run, "--slo", "ttft_p99=1s,tbt_p99=50ms", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["choice"] == "int8"
    result = invoke(app, "report", sweep_run)
    assert result.exit_code == 0, result.output
    assert "SLA capacity" in result.output and "(= bf16 here)" in result.output
