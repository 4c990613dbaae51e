"""One pass over a run: its configurations, the recommendation and the checklist, with
the defaults the report uses when the user gives none (the scenario's SLA, a 1% accuracy
budget, the scenario's KV pool as the memory budget of the checklist).
"""
from __future__ import annotations

from dataclasses import dataclass

from kvmap.config import parse_size
from kvmap.report.checklist import CheckItem, checklist
from kvmap.report.configs import ConfigSummary, summarize
from kvmap.report.loader import Run
from kvmap.report.recommend import Constraints, Recommendation, recommend

DEFAULT_MAX_ACCURACY_DROP_PCT = 1.0


@dataclass
class Analysis:
    run: Run
    configs: list[ConfigSummary]
    constraints: Constraints
    recommendation: Recommendation
    checklist: dict[str, list[CheckItem]]
    budget_bytes: int | None                 # the checklist's KV memory budget


def default_constraints(run: Run) -> Constraints:
    return Constraints(slo=run.slo, max_accuracy_drop_pct=DEFAULT_MAX_ACCURACY_DROP_PCT)


def analyze(run: Run, constraints: Constraints | None = None,
            objective: str = "throughput") -> Analysis:
    constraints = constraints or default_constraints(run)
    configs = summarize(run.cells, run.rows_by_cell, constraints.slo,
                        seed=run.metadata.get("seed") or 0)
    rec = recommend(configs, constraints, objective)
    budget = constraints.kv_budget_bytes
    if budget is None and run.kv_memory:
        try:
            budget = parse_size(run.kv_memory, "kv_memory")
        except ValueError:
            budget = None
    return Analysis(run, configs, constraints, rec, checklist(configs, constraints, budget),
                    budget)
