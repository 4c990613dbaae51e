"""The verdicts and the predicted-beside-measured table as the report shows them: the
HTML template's context (``templates/prediction.html.j2``) and the terminal's text.
The figures are :mod:`kvmap.report.verdict`'s and :mod:`kvmap.report.calibration`'s."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from kvmap.report.calibration import LOADED, Calibration, calibration
from kvmap.report.loader import Run
from kvmap.report.verdict import gpu_sentence, verdicts


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def _num(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def calibration_rows(cal: Calibration) -> list[dict[str, Any]]:
    """One row per predicted cell: measured, predicted and error of each figure."""
    rows = []
    for c in cal.cells:
        m, p, e = c.measured, c.predicted, c.errors
        rows.append({
            "workload": c.workload, "kv": c.kv,
            "throughput": (_num(m["output_tokens_per_s"]), _num(p["output_tokens_per_s"]),
                           _pct(e["output_tokens_per_s"])),
            "tbt": (_num(m["tbt_p50_s"], 1e3), _num(p["tbt_p50_s"], 1e3), _pct(e["tbt_p50_s"])),
            "ttft": (_num(m["ttft_p50_s"], 1e3), _num(p["ttft_p50_s"], 1e3),
                     _pct(e["ttft_p50_s"])),
            "running": (_num(m["concurrency_max"], digits=0),
                        _num(p["concurrency_max"], digits=0)),
            "bound": c.bound or "-", "miss": c.miss,
            "load": None if c.load is None else f"{c.load:.1f}",
            "loaded": c.load is not None and c.load > LOADED})
    return rows


def fit_text(cal: Calibration) -> str:
    """One line: the calibration record, the MAPE of the simulator's throughput and of
    the budget estimate's cell seconds (both on that record), r, cells missed."""
    if not cal.cells:
        return "no cell of this run holds a prediction"
    mape = "-" if cal.mape is None else f"{cal.mape:.0%}"
    r = "-" if cal.pearson_r is None else f"{cal.pearson_r:.3f}"
    est = "-" if cal.estimate_mape is None else f"{cal.estimate_mape:.0%}"
    record = f"calibration {cal.record}: " if cal.record else ""
    return (f"{record}MAPE simulator throughput {mape} over {len(cal.cells)} cells "
            f"(Pearson's r {r}), budget estimate cell time {est} over {cal.num_estimated} "
            f"cells; {len(cal.missed)} cell(s) beyond the {cal.tolerance:.0%} tolerance")


def prediction_context(run: Run) -> dict[str, Any]:
    """The template's ``prediction`` block (None when no cell was predicted)."""
    cal = calibration(run.cells)
    found = verdicts(run.cells, run.rows_by_cell)
    if not cal.cells and not found:
        return {"prediction": None}
    hardware = next((c.hardware for c in cal.cells if c.hardware), None)
    return {"prediction": {
        "hardware": hardware, "fit": fit_text(cal), "rows": calibration_rows(cal),
        "skipped": cal.skipped,
        "verdicts": [{"workload": w, "items": [{"sentence": v.sentence, "kind": v.kind,
                                               "gpu": gpu_sentence(v)} for v in vs]}
                     for w, vs in found.items()]}}


def prediction_text(run: Run) -> Text:
    """The verdicts and the fit, for the terminal (empty without predictions)."""
    block = prediction_context(run)["prediction"]
    text = Text()
    if block is None:
        return text
    for group in block["verdicts"]:
        text.append(f"verdict, deployment {group['workload']}\n", style="bold")
        for item in group["items"]:
            text.append(f"  {item['sentence']}\n")
            if item["gpu"]:
                text.append(f"    {item['gpu']}\n", style="dim")
    text.append(f"predicted beside measured ({block['hardware'] or 'no hardware'}): "
                f"{block['fit']}\n", style="bold")
    return text


def calibration_table(run: Run) -> Table | None:
    block = prediction_context(run)["prediction"]
    if block is None or not block["rows"]:
        return None
    table = Table(title="predicted beside measured (measured / predicted / error)",
                  title_justify="left", header_style="bold")
    for header in ("workload", "kv", "tok/s", "TBT P50 ms", "TTFT P50 ms", "running",
                   "bound", "missed: what the model got wrong"):
        table.add_column(header, overflow="fold")
    for r in block["rows"]:
        table.add_row(r["workload"], r["kv"], " / ".join(r["throughput"]),
                      " / ".join(r["tbt"]), " / ".join(r["ttft"]), " / ".join(r["running"]),
                      r["bound"], (r["miss"] or "") + (f" (load {r['load']})"
                                                       if r["loaded"] else ""))
    return table
