"""One recommendation per deployment: a scenario of several workloads (the evaluation
report's S1 high-throughput and S2 long-context) is several deployments, and each has
its own SLA and its own answer.

A *deployment* is one workload of the run. Its configurations are those that ran it;
its cells are that workload's cells and the accuracy tasks of those configurations;
its SLA is the workload's own (``slo:`` in the workload entry), else the scenario's, or
the one the user gives (``--slo`` holds every deployment to the same SLA). So the SLA,
the objective (the workload's SLA capacity, throughput, peak KV, P99 TBT) and the
"never acted" flags are all read on that workload, and a configuration is never ranked
on a figure another workload measured.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvmap.runs.record import CellRecord
from kvmap.runs.names import base_name
from kvmap.report.configs import ConfigSummary, summarize
from kvmap.report.constraints import Constraints
from kvmap.report.recommend import Recommendation, recommend


@dataclass
class Deployment:
    workload: str
    slo: dict[str, float]
    slo_source: str                      # "workload", "scenario" or "--slo"
    configs: list[ConfigSummary]
    recommendation: Recommendation
    random_weights: bool = False         # every configuration has dummy weights


def workload_names(cells: list[CellRecord]) -> list[str]:
    """The run's workloads in scenario order; a block-size sweep (``frag@bs8``,
    ``frag@bs16``, ...) is one deployment, judged at the first block size it lists (the
    fragmentation table compares the sizes)."""
    names: list[str] = []
    bases: set[str] = set()
    for c in cells:
        w = c.workload
        if w and w not in names and base_name(w) not in bases:
            names.append(w)
            bases.add(base_name(w))
    return names


def _key(c: CellRecord) -> tuple[str, str | None, str]:
    return (c.model, c.quantization, c.kv)


def deployment_cells(cells: list[CellRecord], workload: str) -> list[CellRecord]:
    """The workload's cells and the task cells of the configurations that ran it."""
    ran = {_key(c) for c in cells if c.workload == workload}
    return [c for c in cells if c.workload == workload
            or (c.task and _key(c) in ran)]


def deployments(cells: list[CellRecord], rows_by_cell: dict[str, list[dict[str, Any]]],
                constraints: Constraints, objective: str,
                workload_slo: dict[str, dict[str, float]] | None,
                scenario_slo: dict[str, float] | None, seed: int = 0) -> list[Deployment]:
    """One ``Deployment`` per workload when the run has two or more (else none: the
    run's one recommendation is the deployment's). ``workload_slo`` None: the user's
    ``constraints.slo`` holds for every deployment."""
    names = workload_names(cells)
    if len(names) < 2:
        return []
    several_models = len({c.model for c in cells}) > 1     # names as in the whole run
    out = []
    for w in names:
        if workload_slo is None:
            slo, source = dict(constraints.slo), "--slo"
        elif w in workload_slo:
            slo, source = dict(workload_slo[w]), "workload"
        else:
            slo, source = dict(scenario_slo or {}), "scenario"
        configs = summarize(deployment_cells(cells, w), rows_by_cell, slo, seed=seed,
                            several_models=several_models)
        rec = recommend(configs, replace(constraints, slo=slo), objective)
        out.append(Deployment(w, slo, source, configs, rec, random_weights=bool(configs)
                              and all(c.accuracy_na for c in configs)))
    return out
