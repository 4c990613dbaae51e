"""Cells on demand, within a budget: the tuner's one way to run anything.

``Executor.run(cells)`` hands the cells asked for so far to ``kvmap.bench.runner``'s
``run_scenario`` (the bench's store, backends and cell processes; cells already stored
are skipped, so a repeated ask costs nothing and an interrupted tune resumes), each into
the run of the scenario that holds its job (the main run first: a screens run lives
inside its directory), then reads the runs back with the report's loader, as one
``Run``. The cell budget counts distinct cells asked for; a cell that would pass
``max_cells``, or start after ``max_minutes``, raises ``BudgetExhausted`` instead.
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


def _jobs(scenario: Scenario) -> set[str]:
    return {j.name for j in (*scenario.workloads, *scenario.tasks)}


class Executor:
    def __init__(self, runs: list[tuple[Scenario, Path]], *, max_cells: int,
                 max_minutes: float | None = None, backend: str | CellBackend = "local",
                 console: Console | None = None, clock=time.monotonic):
        self.runs = [(s, Path(d)) for s, d in runs]
        self.scenario, self.run_dir = self.runs[0]
        self.max_cells, self.max_minutes = max_cells, max_minutes
        self.backend, self.console, self.clock = backend, console, clock
        self.asked: dict[Path, list[CellSpec]] = {d: [] for _, d in self.runs}
        self.t_start = clock()
        self.run_data: Run | None = None

    @property
    def num_cells(self) -> int:
        return sum(len(cells) for cells in self.asked.values())

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.t_start

    def _dir_of(self, cell: CellSpec) -> Path:
        return next(d for s, d in self.runs if cell.job in _jobs(s))

    def new(self, cells: list[CellSpec]) -> list[CellSpec]:
        ids = {c.cell_id for asked in self.asked.values() for c in asked}
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
        for cell in fresh:
            self.asked[self._dir_of(cell)].append(cell)
        for scenario, run_dir in self.runs:
            if any(self._dir_of(c) == run_dir for c in fresh):
                run_scenario(scenario, run_dir, cells=self.asked[run_dir],
                             backend=self.backend, console=self.console,
                             show_progress=False)
        if fresh or self.run_data is None:
            self.run_data = self._read()
        by_id = {c.cell_id: c for c in self.run_data.cells}
        return {c.cell_id: by_id[c.cell_id] for c in cells}

    def _read(self) -> Run:
        """Every run with a cell asked, as one ``Run`` (the main run's metadata)."""
        runs = [load_run(d) for _, d in self.runs if self.asked[d]]
        rows = {k: v for r in runs for k, v in r.rows_by_cell.items()}
        return Run(self.run_dir, runs[0].metadata if runs else {},
                   [c for r in runs for c in r.cells], rows)
