"""``benchmarks/run_summary.py``: a run's summary as a committable record -- its metadata,
cell records without request rows, predictions and the terminal summary's text -- so a
figure read from a run directory has a committed source (issue 40)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_summary_holds_the_cells_and_the_report_text_without_request_rows(fake_run):
    config, metrics = _module("run_summary").summary_record(fake_run)
    text = json.dumps(metrics)                              # it serialises as it is
    assert config["run_dir"] == str(fake_run)
    assert {c["cell_id"] for c in metrics["cells"]} >= {"bf16-chat", "int8-chat"}
    assert "token_times_s" not in text and "request_id" not in text
    assert metrics["run"]["num_cells_ok"] == len(metrics["cells"])
    terminal = "\n".join(metrics["terminal"])
    assert "int8" in terminal and "bf16" in terminal


def test_a_figure_of_the_summary_text_is_matched_by_the_audit(fake_run, tmp_path, monkeypatch):
    """The audit reads numbers in a record's strings, so a figure copied from the
    terminal summary matches once the summary is a record."""
    audit = _module("audit_figures")
    _, metrics = _module("run_summary").summary_record(fake_run)
    monkeypatch.setattr(audit, "RESULTS", tmp_path)
    audit.candidates.cache_clear()
    (tmp_path / "run_summary-20261204-000000.json").write_text(json.dumps({"metrics": metrics}))
    rate = next(c["metrics"]["output_tokens_per_s"] for c in metrics["cells"]
                if c["cell_id"] == "int8-chat")
    doc = tmp_path / "doc.md"
    doc.write_text(f"## run\n\nmeasured (record `run_summary-20261204-000000.json`): "
                   f"int8 {rate:.1f} tokens/s, {rate * 3 + 17:.1f} tokens/s\n")
    assert [f.verdict for f in audit.audit_file(doc)] == ["matched", "mismatched"]
    audit.candidates.cache_clear()
