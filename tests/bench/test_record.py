"""``CellRecord`` on both sides of the JSON edge: what a cell writes is what the runner,
the store and the report read back, keys of a newer writer included."""
from __future__ import annotations

import json

import pytest

from kvmap.runs.record import RECORD_SCHEMA, CellRecord
from kvmap.runs.store import RunStore


def task_record(**values) -> CellRecord:
    return CellRecord(cell_id="m-int8-ppl", kind="task", model="m", dtype="bf16", kv="int8",
                      task="ppl", task_kind="ppl", params={"num_samples": 2},
                      metrics={"ppl": 10.5, "grid": [{"n": 1}]},
                      details={"per_sample": [{"sample_id": "s0", "nll": 2.3}]},
                      duration_s=1.5, env={"load_avg_1m_end": 0.5}, **values)


def test_a_record_round_trips_through_its_json():
    record = task_record(warnings=["UserWarning: w"])
    data = json.loads(json.dumps(record.to_dict()))
    assert data["schema"] == RECORD_SCHEMA and data["task_kind"] == "ppl"
    assert "extra" not in data                       # extras are top-level keys
    assert CellRecord.from_dict(data) == record


def test_keys_of_a_newer_writer_are_kept_and_written_back():
    data = {**task_record().to_dict(), "budget_s": 12.5, "sim": {"ttft_s": 0.1}}
    record = CellRecord.from_dict(data)
    assert record.extra == {"budget_s": 12.5, "sim": {"ttft_s": 0.1}}
    assert record.to_dict() == data


def test_absent_fields_stay_absent_as_records_were_written_before():
    data = CellRecord(cell_id="c", kind="workload", model="m", dtype="bf16", kv="bf16",
                      workload="chat").to_dict()
    assert not {"traceback", "env", "task_kind"} & set(data)
    assert CellRecord.from_dict(data).to_dict() == data


@pytest.mark.parametrize("metrics, details, kind", [
    ({"ppl": 9.0}, {}, "ppl"),
    ({"accuracy": 0.5, "n": 2}, {}, "accuracy"),
    ({"mean_output_tokens": 3.0},
     {"per_sample": [{"num_output_tokens": 3, "finish_reason": "stop"}]}, "generation"),
    ({"exact_match": 1.0}, {"per_sample": [{"num_output_tokens": 3}]}, "other"),
])
def test_a_task_record_written_before_task_kind_gets_the_reports_old_rule(
        metrics, details, kind):
    data = task_record().to_dict()
    del data["task_kind"]
    data.update(metrics=metrics, details=details)
    assert CellRecord.from_dict(data).task_kind == kind


@pytest.mark.parametrize("change, match", [
    ({"schema": "kvmap.bench.cell/2"}, "version 1..1"),
    ({"schema": "other/1"}, "is not 'kvmap.bench.cell'"),
    ({"cell_id": None, "kv": None}, None),
])
def test_another_schema_or_a_missing_key_is_refused(change, match):
    data = {**task_record().to_dict(), **change}
    if match is None:                       # null values are values; missing keys are not
        CellRecord.from_dict(data)
        del data["kv"]
        match = "lacks kv"
    with pytest.raises(ValueError, match=match):
        CellRecord.from_dict(data)


def test_the_store_keeps_a_newer_writers_keys(tmp_path):
    store = RunStore(tmp_path)
    record = CellRecord.from_dict({**task_record().to_dict(), "budget_s": 3.0})
    store.write_cell(record, [], 0)
    (back,) = store.cells()
    assert back == record and back.extra == {"budget_s": 3.0}
    assert back.ok and back.job == "ppl" and back.metric("grid", "n") is None
    assert back.metric("ppl") == 10.5 and back.metric("nope", "deeper") is None
