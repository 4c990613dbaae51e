"""Judging one point with the report's own rules, so the tuner and ``kvmap report`` on
its run directory agree.

A point's cells (its workload cell, its task cells) and the baseline's task cells go
through ``kvmap.report.configs.summarize`` (paired accuracy deltas, peak KV, SLA
figures); ``kvmap.report.recommend.check`` and ``objective_value`` give its verdict.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kvmap.report.configs import ConfigSummary, summarize
from kvmap.report.constraints import Constraints, check
from kvmap.report.recommend import higher_is_better, objective_value

@dataclass(frozen=True)
class Point:
    """One configuration: a KV spec and the engine's ``max_num_seqs`` (None: the
    scenario's)."""

    kv: str
    max_num_seqs: int | None = None

    def label(self, with_seqs: bool) -> str:
        return f"{self.kv} @max_num_seqs={self.max_num_seqs}" \
            if with_seqs and self.max_num_seqs is not None else self.kv


@dataclass(frozen=True)
class Verdict:
    ok: bool                            # every constraint that was measured passes
    failed: tuple[str, ...]             # the constraints it fails, as sentences
    accuracy_drop_pct: float | None
    peak_kv_bytes: float | None
    objective: float | None


def summary_of(records: list[dict], baseline: list[dict], rows_by_cell: dict, kv: str,
               slo: dict, seed: int = 0) -> ConfigSummary:
    """The report's summary of the configuration ``kv`` from its own ``records`` and
    the baseline's task ``records`` (the pairing partners)."""
    ids = {r.cell_id for r in records}
    cells = records + [b for b in baseline if b.cell_id not in ids]
    rows = {r.cell_id: rows_by_cell.get(r.cell_id, []) for r in records}
    return next(s for s in summarize(cells, rows, slo, seed) if s.kv == kv)


def verdict(summary: ConfigSummary, constraints: Constraints, objective: str,
            skip: tuple[str, ...] = ()) -> Verdict:
    """``skip``: constraint names not judged yet (the SLA before the workload cell ran)."""
    checks = [c for c in check(summary, constraints) if c.name not in skip]
    failed = tuple(c.describe() for c in checks if not c.ok)
    return Verdict(not failed, failed, summary.accuracy_drop_pct, summary.peak_kv_bytes,
                   objective_value(summary, objective))


def better(a: Verdict, b: Verdict | None, objective: str) -> bool:
    """Whether ``a`` beats ``b`` on the objective (a missing figure never wins)."""
    if b is None or b.objective is None:
        return a.objective is not None
    if a.objective is None:
        return False
    return a.objective > b.objective if higher_is_better(objective) else a.objective < b.objective


def renamed(summary: ConfigSummary, name: str) -> ConfigSummary:
    return replace(summary, name=name)
