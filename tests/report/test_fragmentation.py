"""The report's fragmentation table on hand-made records with known answers."""
from __future__ import annotations

import pytest

from kvmap.runs.record import CellRecord
from kvmap.report.fragmentation import (HEADERS, formatted, fragmentation_rows,
                                        fragmentation_table)


def cell(kv, workload, block_size, tput, tbt_p50_s, waste_max, waste_mean, share, *,
         load=None, status="ok", model="smollm2", record_size=True,
         tput_key="output_throughput_tok_s"):
    metrics = {tput_key: tput, "tbt_s": {"p50": tbt_p50_s},
               "kv_waste_bytes_max": waste_max, "kv_waste_bytes_mean": waste_mean,
               "kv_waste_share_mean": share}
    if record_size:
        metrics["kv_block_size"] = block_size
    return CellRecord(cell_id=f"{kv}-{workload}-{load}", kind="workload", model=model,
                      kv=kv, dtype="bf16", workload=workload, status=status,
                      load={"label": load, "value": 1.0} if load else None, metrics=metrics)


def test_rows_group_by_configuration_and_level_relative_to_16():
    cells = [
        cell("bf16", "frag@bs8", 8, 90.0, 0.020, 1000, 400, 0.02),
        cell("bf16", "frag@bs16", 16, 100.0, 0.016, 2000, 800, 0.04),
        cell("bf16", "frag@bs64", 64, 110.0, 0.012, 8000, 3200, 0.16),
        cell("int8", "frag@bs8", 8, 50.0, 0.040, 500, 200, 0.02, record_size=False),
        cell("int8", "frag@bs32", 32, 80.0, 0.030, 2000, 900, 0.08,
             tput_key="output_tokens_per_s"),                 # the writers' own name
        cell("bf16", "plain", 16, 1.0, 0.1, 1, 1, 0.5),                 # no sweep: no row
        cell("bf16", "frag@bs32", 32, 1.0, 0.1, 1, 1, 0.5, status="failed"),
    ]
    rows = fragmentation_rows(cells)
    assert [(r.config, r.block_size) for r in rows] == [
        ("bf16", 8), ("bf16", 16), ("bf16", 64), ("int8", 8), ("int8", 32)]
    bf16_8, bf16_16, bf16_64, int8_8, int8_32 = rows
    assert bf16_8.reference_block_size == 16 and bf16_8.workload == "frag"
    assert bf16_8.throughput_ratio == pytest.approx(0.9)
    assert bf16_8.tbt_p50_ratio == pytest.approx(1.25)
    assert bf16_16.throughput_ratio == 1.0 and bf16_16.tbt_p50_ratio == 1.0
    assert bf16_64.waste_bytes_max == 8000 and bf16_64.waste_share_mean == 0.16
    # no 16 in int8's sweep: the smallest is the reference; size from the name suffix
    assert int8_8.reference_block_size == 8 and int8_8.block_size == 8
    assert int8_32.throughput_ratio == pytest.approx(1.6)
    assert int8_32.tbt_p50_ratio == pytest.approx(0.75)


def test_load_levels_and_models_are_separate_groups():
    cells = [cell("bf16", "frag@bs8", 8, 10.0, 0.01, 1, 1, 0.1, load="closed:1"),
             cell("bf16", "frag@bs16", 16, 20.0, 0.01, 1, 1, 0.1, load="closed:1"),
             cell("bf16", "frag@bs8", 8, 30.0, 0.01, 1, 1, 0.1, load="closed:8"),
             cell("bf16", "frag@bs16", 16, 60.0, 0.02, 1, 1, 0.1, load="closed:8"),
             cell("bf16", "frag@bs8", 8, 5.0, 0.01, 1, 1, 0.1, model="other")]
    rows = fragmentation_rows(cells)
    assert [(r.config, r.load, r.throughput_ratio) for r in rows] == [
        ("smollm2: bf16", "closed:1", 0.5), ("smollm2: bf16", "closed:1", 1.0),
        ("smollm2: bf16", "closed:8", 0.5), ("smollm2: bf16", "closed:8", 1.0),
        ("other: bf16", None, 1.0)]


def test_formatting_and_missing_figures():
    rows = fragmentation_rows([cell("bf16", "f@bs16", 16, None, None, 3 * 1024, None, 0.125),
                               cell("bf16", "f@bs32", 32, 7.0, 0.5, 0, 0, 0.0)])
    assert len(HEADERS) == len(formatted(rows[0]))
    assert formatted(rows[0]) == ["bf16", "f", "16 (ref)", "3.0 KiB", "-", "12.5%", "-",
                                  "-", "-", "-"]
    assert formatted(rows[1])[2:] == ["32", "0 B", "0 B", "0.0%", "7.0", "-", "500.0", "-"]
    assert fragmentation_table([cell("bf16", "plain", 16, 1.0, 0.1, 1, 1, 0.5)]) is None
    assert fragmentation_table([cell("bf16", "f@bs16", 16, 1.0, 0.1, 1, 1, 0.5)]).row_count == 1


def test_the_report_shows_the_table_in_the_terminal_and_the_html(tmp_path):
    from typer.testing import CliRunner

    from kvmap.cli import app
    from tests.report.conftest import _workload, store_run
    sweep = []
    for size, gap_s in ((8, 0.06), (16, 0.05)):
        record, rows = _workload("bf16", gap_s, 0.2, 40 << 20, 1000, 2.0)
        record.cell_id, record.workload = f"bf16-chat-bs{size}", f"chat@bs{size}"
        record.metrics.update(kv_block_size=size, kv_waste_bytes_max=size * 1024,
                                 kv_waste_bytes_mean=size * 512, kv_waste_share_mean=0.01)
        sweep.append((record, rows))
    run = store_run(tmp_path / "run", sweep, {"name": "frag", "slo": {"ttft_p99_s": 5.0}})
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "fragmentation: internal KV waste against block size" in result.output
    assert "16 (ref)" in result.output and "8.0 KiB" in result.output
    html = (run / "report.html").read_text()
    table = html[html.index('<table id="fragmentation">'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == 3 and "16 (ref)" in table and "16.0 KiB" in table
