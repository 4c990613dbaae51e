"""Adding an eval task is one file with ``@TASKS.register``: a test double registered here
is picked up by the bench's task check, ``kvmap eval`` (valid names, its table's
columns, its options) and the report's task columns, with no other edit."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from kvmap.evals import TASKS, Column, EvalOptions, Task, TaskRun
from kvmap.evals.stats import accuracy_metrics
from tests.evals.test_evals import tiny_factory


class CountTask(Task):
    """Correct when the first generated token is even: a task that needs no model skill."""

    name = "even_first_token"
    kind = "accuracy"                     # judged as a share of samples right
    takes = frozenset({"context_tokens"})

    def max_tokens_needed(self, samples=None) -> int:
        return 16

    def prepare(self, tokenizer):
        return [[7, 8, 9], [1, 2, 3, 4]][: self.options.num_samples or 2]

    def run(self, llm, samples) -> TaskRun:
        from kvmap import SamplingParams
        outs = llm.generate(samples, SamplingParams(max_tokens=1))
        correct = [o.token_ids[0] % 2 == 0 for o in outs]
        return TaskRun({**accuracy_metrics(correct),
                        "odd_share": 1 - sum(correct) / len(correct)},
                       [{"sample_id": f"even/{i}", "correct": c} for i, c in enumerate(correct)])


class DeclaredColumns(CountTask):
    name = "even_declared"
    columns = (Column("share even", "accuracy", "{:.1%}"),)


@pytest.fixture
def registered():
    TASKS.register(CountTask)
    TASKS.register(DeclaredColumns)
    yield
    TASKS.unregister(CountTask.name)
    TASKS.unregister(DeclaredColumns.name)


def test_bench_task_check_accepts_a_registered_task(registered):
    from kvmap.bench.tasks import check_task_params, resolve_task, task_tokens_needed
    assert resolve_task("even_first_token") == "even_first_token"
    check_task_params("even_first_token", "even_first_token", {"num_samples": 1})
    assert task_tokens_needed("even_first_token", {}) == 16
    TASKS.unregister(CountTask.name)
    with pytest.raises(ValueError, match="unknown task 'even_first_token'"):
        resolve_task("even_first_token")


def cli(*args):
    from kvmap.evals.command import register
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Test app."""

    register(app, make_llm=tiny_factory())
    return CliRunner().invoke(app, ["eval", *args])


def test_cli_runs_a_registered_task_with_generic_or_declared_columns(registered):
    out = cli("--task", "even_first_token", "--kv", "fp32", "--kv", "int8", "--dtype", "fp32")
    assert out.exit_code == 0, out.output
    for header in ("accuracy", "num_samples", "odd_share", "delta_accuracy", "int8"):
        assert header in out.stdout           # generic columns: the task declared none
    out = cli("--task", "even_declared", "--kv", "int8", "--dtype", "fp32")
    assert out.exit_code == 0, out.output
    assert "share even" in out.stdout and "odd_share" not in out.stdout
    out = cli("--task", "even_first_token", "--kv", "int8", "--dtype", "fp32", "--json")
    result = json.loads(out.stdout)
    assert [r["sample_id"] for r in result["results"][0]["per_sample"]] == ["even/0", "even/1"]
    assert result["results"][0]["metrics"]["negative_rate"] >= 0.0


def test_cli_names_registered_tasks_and_their_options(registered):
    out = cli("--task", "nope", "--kv", "int8")
    assert out.exit_code == 2 and "even_first_token" in out.output
    out = cli("--task", "even_first_token", "--kv", "int8", "--depth", "0.5")
    assert out.exit_code == 2 and "--depth does not apply to task 'even_first_token'" in out.output


def test_report_has_a_column_for_a_registered_task(registered, tmp_path):
    from kvmap.report.configs import summarize
    from kvmap.report.table import metric_rows
    from tests.report.conftest import _record
    metrics = {**accuracy_metrics([True, False]), "peak_kv_resident_bytes": 1 << 20}
    per_sample = [{"sample_id": "even/0", "correct": True},
                  {"sample_id": "even/1", "correct": False}]
    from kvmap.bench.tasks import task_kind
    kind = task_kind("even_first_token", metrics, {})       # what the bench stores
    cells = [_record(f"{kv}-even", kv, "task", metrics, task="even_first_token",
                     details={"per_sample": per_sample}, task_kind=kind)
             for kv in ("bf16", "int8")]
    headers, rows = metric_rows(summarize(cells, {}))
    column = headers.index("even_first_token")
    assert all("50%" in r.cells[column - 1] for r in rows) and len(rows) == 2   # cells: after "config"


def test_every_registered_task_says_how_the_report_judges_it():
    from kvmap.evals import TASK_KINDS
    kinds = {name: TASKS[name].kind for name in TASKS}
    assert set(kinds.values()) <= set(TASK_KINDS), kinds
    assert kinds["ppl"] == "ppl" and kinds["passkey"] == "accuracy"
    assert kinds["chat_generation"] == "generation"
