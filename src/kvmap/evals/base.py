"""The eval-task family: its registry, its options, the ``Task`` base and a run's result.

A task is one file that registers itself::

    @TASKS.register
    class PPLTask(Task):
        name = "ppl"
        columns = (Column("ppl", "ppl", "{:.3f}"), ...)

``kvmap.evals`` imports every task module, so importing it fills ``TASKS``; the CLI,
the bench's task check and the report find tasks there and nowhere else.

A ``Task`` prepares its samples once (same text, same seed for every configuration),
runs them through one ``LLM`` at a time, and compares a run with the baseline's. Each
run carries one record per sample (``TaskRun.per_sample``) with a ``sample_id`` that is
the same for the same sample in every configuration, and the task's paired value under
``value_key``: the paired delta, and for pass/fail tasks the negative-sample rate, pair
records by that id (``kvmap.evals.stats``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from kvmap.evals.stats import negative_rate, paired_delta, paired_values
from kvmap.registry import Registry
from kvmap.workloads.files import jsonl_records, require_file


# How a task's result is judged -- its ``kind``, stored in each task cell's record
# (``CellRecord.task_kind``) for the report: ``ppl`` a perplexity and its rise, ``accuracy``
# a share of samples right and its drop, ``generation`` natural stopping (the output's
# length against the baseline's), ``other`` its agreement with the baseline's outputs.
TASK_KINDS = ("ppl", "accuracy", "generation", "other")


class Column(NamedTuple):
    """One column of ``kvmap eval``'s table: header, metric key, format (``"ci"``: an
    interval dict ``{"ci_low", "ci_high"}`` or a ``[lo, hi]`` pair)."""

    header: str
    key: str
    fmt: str


@dataclass(frozen=True)
class EvalOptions:
    """What a task runs on. Empty / None fields take the task's defaults."""

    context_tokens: tuple[int, ...] = ()     # ppl, generation: one; passkey, needle: a grid
    num_samples: int | None = None           # per task (per grid cell for passkey/needle)
    seed: int = 0
    text: str | None = None                  # corpus text replacing the built-in one
    data_path: str | None = None             # mc: the JSONL file
    continuation_tokens: int | None = None   # ppl: tokens scored; generation: generated
    depths: tuple[float, ...] = ()           # passkey, needle: needle depths in [0, 1]
    num_needles: int | None = None           # needle: needles per prompt
    num_top_logprobs: int | None = None      # prompt_ppl: top-k kept per position (KL, top-1)

    def __post_init__(self) -> None:
        for n in self.context_tokens:
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"context={n!r} must be a positive number of tokens")
        for name in ("num_samples", "continuation_tokens", "num_needles", "num_top_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be a positive integer")
        for d in self.depths:
            if not 0.0 <= d <= 1.0:
                raise ValueError(f"depth={d!r} must be in [0, 1]")


@dataclass
class TaskRun:
    """One configuration's pass over the samples: ``metrics`` (JSON-able), one record per
    sample (JSON-able dicts with ``sample_id`` and the task's ``value_key``), and
    whatever the comparison needs (``state``, not reported, not stored)."""

    metrics: dict
    per_sample: list[dict]
    state: Any = field(default=None, repr=False)


class Task:
    """Base: subclasses set ``name`` (and ``columns``) and override ``prepare`` and
    ``run``; ``compare`` adds the paired delta of the records' ``value_key`` as
    ``delta_<paired_metric>``, and for pass/fail values the negative-sample rate."""

    name: ClassVar[str]
    kind: ClassVar[str] = "other"                # one of TASK_KINDS
    paired_metric: ClassVar[str] = "accuracy"
    value_key: ClassVar[str] = "correct"         # the paired value in each record
    columns: ClassVar[tuple[Column, ...]] = ()   # () -> the generic columns of kvmap eval
    # True when ``compare`` reads the baseline's ``state`` (e.g. ppl's log-probabilities
    # for the KL), which no store keeps: a runner that runs each configuration apart must
    # run the baseline beside it. False: records and metrics are enough.
    needs_baseline_state: ClassVar[bool] = False
    # True when the same comparison can also be made from two runs' stored records (the
    # report does it for a cell whose baseline ran apart, e.g. an endpoint's).
    compares_records: ClassVar[bool] = False
    # EvalOptions fields this task reads besides num_samples and seed: the CLI refuses
    # the others' options for it.
    takes: ClassVar[frozenset[str]] = frozenset({"context_tokens", "text"})

    def __init__(self, options: EvalOptions):
        self.options = options

    def max_tokens_needed(self, samples: list | None = None) -> int:
        """The longest sequence (prompt + output tokens) a sample may need: from the
        options alone when ``samples`` is None (0 = not known before ``prepare``)."""
        return 0

    def prepare(self, tokenizer) -> list:
        raise NotImplementedError

    def run(self, llm, samples: list) -> TaskRun:
        raise NotImplementedError

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        mine, theirs = paired_values(run.per_sample, baseline.per_sample, self.value_key)
        out = {**run.metrics,
               f"delta_{self.paired_metric}": paired_delta(mine, theirs, seed=self.options.seed)}
        if all(isinstance(r.get(self.value_key), bool) for r in run.per_sample):
            rate, ci = negative_rate(mine, theirs)
            out.update(negative_rate=rate, negative_rate_ci95=ci)
        return out


TASKS: Registry[type[Task]] = Registry("eval task")


def get_task(name: str, options: EvalOptions) -> Task:
    """The task called ``name``; ValueError listing the known names otherwise."""
    if name not in TASKS:
        raise ValueError(f"task {name!r} is not one of {', '.join(TASKS)}")
    return TASKS.get(name)(options)


def load_jsonl_items(path, parse: Callable[[object, str], Any]) -> list:
    """``parse(record, "file:line")`` of every line of a task's JSONL data file;
    ValueError naming the path (missing, no items) or the bad line."""
    path = require_file(path, "data file")
    items = [parse(record, f"{path}:{n}") for n, record in
             jsonl_records(path.read_text(encoding="utf-8").splitlines(),
                           lambda n: f"{path}:{n}")]
    if not items:
        raise ValueError(f"data file {str(path)!r} has no questions")
    return items
