"""The typed views of a record's payloads (``runs/workload_metrics.py``,
``runs/cell_payloads.py``): every key the committed runs hold is named by a view, a value
of the wrong kind is refused naming the cell and the key, a legacy key reads under its
current name, and a newer writer's key is kept in ``extra``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmap.runs.record import CellRecord
from kvmap.runs.task_metrics import PplMetrics, interval
from kvmap.runs.workload_metrics import WorkloadMetrics

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def committed_cells() -> list[CellRecord]:
    cells = []
    for path in sorted(RESULTS.glob("run_summary-*.json")):
        cells += [CellRecord.from_dict(c)
                  for c in json.loads(path.read_text())["metrics"]["cells"]]
    return cells


def test_every_key_of_the_committed_runs_is_named_by_a_view():
    cells = committed_cells()
    workload = [c for c in cells if c.kind == "workload" and c.ok]
    assert len(workload) >= 100                      # five default runs
    for c in workload:
        m = c.workload_metrics
        assert m.extra == {}, (c.cell_id, sorted(m.extra))
        assert m.output_tokens_per_s == c.metrics["output_tokens_per_s"]
        assert m.summary("tbt_s").p99 == c.metrics["tbt_s"]["p99"]
        assert c.cell_env.extra == {} and c.cell_estimate.extra == {}
        p = c.cell_prediction
        if p is not None and p.why_not is None:
            assert p.extra == {} and p.metrics is not None and p.metrics.extra == {}
            assert p.metrics.output_tokens_per_s == \
                c.prediction["metrics"]["output_tokens_per_s"]
            assert p.roofline.weight_bytes == c.prediction["roofline"]["weight_bytes"]
    tasks = [c for c in cells if c.kind == "task" and c.ok]
    kinds = {type(c.task_metrics).__name__ for c in tasks}
    assert {"PplMetrics", "AccuracyMetrics"} <= kinds
    for c in tasks:
        assert c.task_metrics.extra == {}, (c.cell_id, sorted(c.task_metrics.extra))
    ppl = [c.task_metrics for c in tasks if c.task_kind == "ppl"]
    assert all(isinstance(m, PplMetrics) and m.ppl is not None for m in ppl)
    probed = [c.workload_metrics.probes for c in workload if c.metrics.get("probes")]
    assert probed and all(p is not None and p.decode_ops is not None
                          and p.decode_ops.num_ops_per_step is not None for p in probed)


def record(metrics: dict, **values) -> CellRecord:
    return CellRecord(cell_id="c1", kind="workload", model="m", dtype="bf16", kv="int8",
                      workload="chat", metrics=metrics, **values)


def test_a_value_of_the_wrong_kind_names_the_cell_and_the_key():
    with pytest.raises(ValueError, match=r"metrics of cell 'c1': output_tokens_per_s='fast' "
                                         r"is not a number"):
        record({"output_tokens_per_s": "fast"}).workload_metrics
    with pytest.raises(ValueError, match=r"metrics of cell 'c1', tbt_s: .*p99=\[1\] is not "
                                         r"a number"):
        record({"tbt_s": {"p99": [1]}}).workload_metrics
    with pytest.raises(ValueError, match=r"tiers: .*tier 'host': num_hits=True is not a "
                                         r"number"):
        record({"tiers": {"host": {"num_hits": True}}}).workload_metrics
    with pytest.raises(ValueError, match=r"prediction of cell 'c1', roofline: .*"
                                         r"weight_bytes='540MB' is not a number"):
        record({}, prediction={"roofline": {"weight_bytes": "540MB"}}).cell_prediction
    with pytest.raises(ValueError, match=r"env of cell 'c1' is not a JSON object \(a list"):
        record({}, env=[1]).cell_env
    task = CellRecord(cell_id="t1", kind="task", model="m", dtype="bf16", kv="int8",
                      task="ppl", metrics={"ppl": 3.0})
    with pytest.raises(ValueError, match="cell 't1' is a task cell"):
        task.workload_metrics


def test_legacy_and_newer_keys():
    # older records named the output rate output_throughput_tok_s
    assert record({"output_throughput_tok_s": 12.5}).workload_metrics.output_tokens_per_s \
        == 12.5
    both = record({"output_throughput_tok_s": 1.0, "output_tokens_per_s": 2.0})
    assert both.workload_metrics.output_tokens_per_s == 2.0
    assert both.workload_metrics.extra == {"output_throughput_tok_s": 1.0}
    newer = record({"num_requests": 4, "future_key": {"x": 1},
                    "tbt_s": {"p50": 0.1, "p999": 0.5}}).workload_metrics
    assert newer.num_requests == 4 and newer.extra == {"future_key": {"x": 1}}
    assert newer.tbt_s is not None and newer.tbt_s.extra == {"p999": 0.5}
    # a record written before a key existed: None, and an empty summary
    empty = WorkloadMetrics.read({})
    assert empty.concurrency_mean is None and empty.summary("ttft_s").p99 is None
    assert record({}).cell_prediction is None and record({}).cell_env.machine_class is None
    # a JSON null on a field that is never None keeps its default; {} probes read as none
    nulls = record({"probes": {"stability": {}}},
                   prediction={"roofline": None, "gpu": {"metrics": None}})
    p = nulls.cell_prediction
    assert p is not None and p.roofline.weight_bytes is None
    assert p.gpu is not None and p.gpu.metrics.output_tokens_per_s is None
    probes = nulls.workload_metrics.probes
    assert probes is not None and probes.stability is None
    skipped = record({}, prediction={"skipped": "another machine"}).cell_prediction
    assert skipped is not None and skipped.why_not == "another machine"


def test_a_task_interval_reads_in_both_written_forms():
    assert interval([0.1, 0.3]) == (0.1, 0.3)
    assert interval({"ci_low": -1.0, "ci_high": 2.0, "mean": 0.5}) == (-1.0, 2.0)
    assert interval([0.1, None]) is None and interval(None) is None
    # a task may write either form; the view keeps it and interval() reads it
    both = CellRecord(cell_id="t2", kind="task", model="m", dtype="bf16", kv="int8",
                      task="qa", task_kind="accuracy",
                      metrics={"accuracy": 0.8,
                               "accuracy_ci95": {"ci_low": 0.7, "ci_high": 0.9}})
    assert interval(both.task_metrics.accuracy_ci95) == (0.7, 0.9)
    task = CellRecord(cell_id="t1", kind="task", model="m", dtype="bf16", kv="int8",
                      task="ppl", task_kind="ppl", metrics={"ppl": "high"})
    with pytest.raises(ValueError, match=r"task cell 't1': ppl='high' is not a number"):
        task.task_metrics
    with pytest.raises(ValueError, match="cell 'c1' is a workload cell"):
        record({}).task_metrics
