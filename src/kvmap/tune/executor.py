"""Cells on demand, within a budget: the tuner's one way to run anything.

``Executor.run(cells)`` hands the cells asked for so far to ``kvmap.bench.runner``'s
``run_scenario`` (the bench's store, backends and cell processes; cells already stored
are skipped, so a repeated ask costs nothing and an interrupted tune resumes), then
reads the run back with the report's loader. The cell budget counts distinct cells
asked for; a cell that would pass ``max_cells``, or start after ``max_minutes``,
raises ``BudgetExhausted`` instead of running.
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from kvmap.bench.backends import CellBackend
from kvmap.bench.cellspec import CellSpec, Scenario
from kvmap.bench.runner import run_scenario
from kvmap.report.loader import Run, load_run


class BudgetExhausted(Exception):
    """The next cell would pass the cell or time budget."""


class Executor:
    def __init__(self, scenario: Scenario, run_dir: str | Path, *, max_cells: int,
                 max_minutes: float | None = None, backend: str | CellBackend = "local",
                 console: Console | None = None, clock=time.monotonic):
        self.scenario, self.run_dir = scenario, Path(run_dir)
        self.max_cells, self.max_minutes = max_cells, max_minutes
        self.backend, self.console, self.clock = backend, console, clock
        self.asked: list[CellSpec] = []
        self.t_start = clock()
        self.run_data: Run | None = None

    @property
    def num_cells(self) -> int:
        return len(self.asked)

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.t_start

    def new(self, cells: list[CellSpec]) -> list[CellSpec]:
        ids = {c.cell_id for c in self.asked}
        return [c for c in dict((c.cell_id, c) for c in cells).values() if c.cell_id not in ids]

    def fits(self, cells: list[CellSpec]) -> bool:
        """Whether asking for ``cells`` stays within the budgets."""
        fresh = self.new(cells)
        if not fresh:
            return True
        if self.num_cells + len(fresh) > self.max_cells:
            return False
        return self.max_minutes is None or self.elapsed_s < 60.0 * self.max_minutes

    def run(self, cells: list[CellSpec]) -> dict[str, dict]:
        """The records of ``cells`` by cell id (running those not stored yet)."""
        fresh = self.new(cells)
        if not self.fits(cells):
            raise BudgetExhausted(
                f"{len(fresh)} more cell(s) would pass --max-cells {self.max_cells} "
                f"({self.num_cells} used) or --max-minutes {self.max_minutes}")
        if fresh or self.run_data is None:
            self.asked += fresh
            run_scenario(self.scenario, self.run_dir, cells=self.asked, backend=self.backend,
                         console=self.console, show_progress=False)
            self.run_data = load_run(self.run_dir)
        by_id = {c["cell_id"]: c for c in self.run_data.cells}
        return {c.cell_id: by_id[c.cell_id] for c in cells}
