"""One pass over a run: its configurations, the recommendation and the checklist, with
the defaults the report uses when the user gives none (the scenario's SLA, a 1% accuracy
budget, the scenario's KV pool as the memory budget of the checklist).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvmap.config import parse_size
from kvmap.report.checklist import CheckItem, checklist
from kvmap.report.configs import ConfigSummary, summarize
from kvmap.report.deployments import Deployment, deployments, workload_names
from kvmap.report.loader import Run
from kvmap.report.constraints import Constraints
from kvmap.report.recommend import Recommendation, recommend

DEFAULT_MAX_ACCURACY_DROP_PCT = 1.0


@dataclass
class Analysis:
    run: Run
    configs: list[ConfigSummary]
    constraints: Constraints
    recommendation: Recommendation
    checklist: dict[str, list[CheckItem]]
    budget_bytes: int | None                 # the checklist's KV memory budget
    deployments: list[Deployment] = field(default_factory=list)   # one per workload


    def slo_of(self, workload: str) -> dict[str, float]:
        """The SLA ``workload`` is held to (its deployment's, else the run's)."""
        return next((d.slo for d in self.deployments if d.workload == workload),
                    self.constraints.slo)


def default_constraints(run: Run) -> Constraints:
    return Constraints(slo=run.slo, max_accuracy_drop_pct=DEFAULT_MAX_ACCURACY_DROP_PCT)


def analyze(run: Run, constraints: Constraints | None = None,
            objective: str = "throughput", per_workload_slo: bool = True) -> Analysis:
    """``per_workload_slo``: hold each deployment to its workload's own SLA (False when
    the user gave one ``--slo`` for all). When workloads carry their own SLA, the run's
    recommendation is its primary deployment's (the workload with the most requests)."""
    constraints = constraints or default_constraints(run)
    seed = run.meta.seed or 0
    workload_slo = run.workload_slo if per_workload_slo else None
    names = workload_names(run.cells)
    if workload_slo and len(names) == 1 and names[0] in workload_slo:
        constraints = replace(constraints, slo=workload_slo[names[0]])   # the bench's own
    configs = summarize(run.cells, run.rows_by_cell, constraints.slo, seed=seed)
    deps = deployments(run.cells, run.rows_by_cell, constraints, objective, workload_slo,
                       run.slo, seed=seed)
    primary = next((d for d in deps if configs and d.workload == configs[0].primary_workload),
                   None)
    budget = constraints.kv_budget_bytes
    if budget is None and run.kv_memory:
        try:
            budget = parse_size(run.kv_memory, "kv_memory")
        except ValueError:
            budget = None
    if primary is not None and workload_slo:
        # the headline is the primary deployment's: its answer and its checklist are
        # read on that workload under its own SLA
        held = replace(constraints, slo=primary.slo)
        return Analysis(run, configs, held, primary.recommendation,
                        checklist(primary.configs, held, budget), budget, deps)
    rec = recommend(configs, constraints, objective)
    return Analysis(run, configs, constraints, rec, checklist(configs, constraints, budget),
                    budget, deps)
