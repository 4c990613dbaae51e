"""A run's ``run.json`` typed (``RunStore.metadata``): when and how the run was made (its
command, seed, git, versions, machine and hardware profile), the scenario as written (a
dict: its sections are the bench's to parse), the preflight's estimate and budget plan,
and the re-plans after the first cells. Keys this view does not name stay in ``extra``
(``runs.payload.view``); every field is None for a run written before it existed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvmap.runs.payload import view


@dataclass(frozen=True)
class BudgetPlan:
    """The preflight's plan for the time budget (``bench.budget``): the estimate as
    written and as sized, each cut (``name``, ``key``, ``written``, ``value``,
    ``minimum``, ``why_minimum``) and each cell or search left out (``cell_id``,
    ``reason``)."""

    budget_s: float | None = None
    estimate_s: float | None = None
    written_estimate_s: float | None = None
    minimum_estimate_s: float | None = None
    scale: float | None = None
    cuts: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Replan:
    """The re-plans after the first cells (``bench.replan``): actual over estimate and,
    per re-plan, what it cut from the cells not yet run."""

    ratio: float | None = None
    cells_timed: int | None = None
    replans: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def _listed(data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise ValueError(f"is not a list ({data!r:.80})")
    return data


@dataclass(frozen=True)
class RunMetadata:
    """``run.json`` of one run (``docs/bench.md``)."""

    schema: str | None = None
    run_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    seed: int | None = None
    fingerprint: str | None = None
    command: list[str] | None = None
    scenario: dict[str, Any] | None = None
    input_files: dict[str, Any] | None = None
    git: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None
    machine: dict[str, Any] | None = None
    hardware: dict[str, Any] | None = None
    backend: dict[str, Any] | None = None
    thread_settings: dict[str, Any] | None = None
    num_cells_ok: int | None = None
    num_cells_failed: int | None = None
    interrupted: bool | None = None
    preflight: dict[str, Any] | None = None      # bench.preflight: estimate, budget plan
    replan: Replan | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any, where: str = "run.json") -> RunMetadata:
        return view(cls, data, where, nested={"replan": lambda d: view(
            Replan, d, "", nested={"replans": _listed}) if d else None})

    @property
    def budget_plan(self) -> BudgetPlan | None:
        """The preflight's budget plan (None: the run was not sized to a budget)."""
        plan = (self.preflight or {}).get("budget")
        if not plan:
            return None
        return view(BudgetPlan, plan, "run.json, preflight.budget",
                    nested={"cuts": _listed, "left_out": _listed})
