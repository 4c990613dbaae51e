"""The report's layer-kind table on hand-made records with known answers: each hybrid
cell's bytes by kind, and the saving of a windowed cell against its ``all_global``
twin (same model, workload, level and spec less the window layout)."""
from __future__ import annotations

import pytest

from kvmap.runs.record import CellRecord
from kvmap.report.hybrid_saving import (formatted, layer_kind_rows, layer_kind_table,
                                        split_window_layout)

MIB = 1 << 20


def cell(kv, by_kind, *, workload="long-context-gemma", model="gemma3-270m", load=None,
         status="ok", kind="workload"):
    return CellRecord(cell_id=f"{model}-{kv}-{workload}-{load}", kind=kind, model=model,
                      kv=kv, dtype="bf16", workload=workload, status=status,
                      load={"label": load, "value": 1.0} if load else None,
                      metrics={"peak_kv_resident_bytes_by_kind": by_kind})


def test_split_window_layout_keys_a_spec_and_its_all_global_twin_alike():
    assert split_window_layout("auto+all_global") == ("auto", True)
    # the bench names a bare auto cell by its dtype: the pair still meets
    assert split_window_layout("auto+all_global", "bf16") == ("bf16", True) == \
        (split_window_layout("bf16", "bf16")[0], True)
    assert split_window_layout("snapkv(budget=0.2) + int8") == ("int8+snapkv(budget=0.2)",
                                                               False)
    assert split_window_layout("all_global+snapkv(budget=0.2)", "bf16")[0] == \
        split_window_layout("bf16+snapkv(budget=0.2)", "bf16")[0] == "bf16+snapkv(budget=0.2)"


def test_a_windowed_row_carries_the_saving_with_both_numbers():
    cells = [cell("bf16", {"global": 24 * MIB, "sliding": 16 * MIB}),
             cell("int8", {"global": 12 * MIB, "sliding": 8 * MIB}),
             cell("auto+all_global", {"global": 24 * MIB, "sliding": 120 * MIB}),
             cell("auto", {"global": 1, "sliding": 1}, status="failed"),
             cell("auto", None),                                     # not hybrid: no row
             cell("auto", {"global": 24 * MIB, "sliding": 16 * MIB}, kind="task")]
    rows = layer_kind_rows(cells)
    assert [(r.config, r.all_global) for r in rows] == [
        ("bf16", False), ("int8", False), ("auto+all_global", True)]
    auto, int8, flat = rows
    assert auto.total_bytes == 40 * MIB and auto.saving == pytest.approx(144 / 40)
    assert int8.saving is None and flat.saving is None     # int8 has no all-global twin
    assert formatted(auto) == [
        "bf16", "long-context-gemma", "global 24.0 MiB, sliding 16.0 MiB", "40.0 MiB",
        "3.60x (40.0 MiB windowed vs 144.0 MiB all-global)"]
    assert formatted(flat)[-1] == "(the all-global reference)" and formatted(int8)[-1] == "-"
    assert layer_kind_table(cells) is not None


def test_levels_workloads_and_models_pair_separately():
    cells = [cell("auto", {"global": 10, "sliding": 10}, load="closed:1"),
             cell("auto+all_global", {"global": 10, "sliding": 90}, load="closed:2"),
             cell("auto", {"global": 10, "sliding": 10}, workload="other"),
             cell("auto+all_global", {"global": 30, "sliding": 30}, model="gemma-b")]
    rows = layer_kind_rows(cells)
    assert [r.saving for r in rows] == [None] * 4
    assert rows[0].config == "gemma3-270m: auto" and rows[0].workload == \
        "long-context-gemma@closed:1"
    assert layer_kind_table([cell("auto", None)]) is None
