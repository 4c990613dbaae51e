"""``run_tune``: a tune from its inputs to a run directory with ``tune.json`` in it.

Everything is validated first -- the space, the scenario it becomes (KV specs, workload,
task, SLA metrics), the objective, the cell budget -- so a bad input is a ``ValueError``
naming it before any cell runs. The run directory holds the main run (full task and
workload cells: what ``kvmap report`` judges) and ``screens/``, the screen cells' run. ``backend`` is the bench's cell backend (a
``LocalBackend(run_cell)`` with a stub ``run_cell`` in tests).
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from kvmap.bench.backends import CellBackend
from kvmap.report.constraints import Constraints
from kvmap.report.recommend import check_objective
from kvmap.tune.executor import Executor
from kvmap.tune.path import write_path
from kvmap.tune.search import Search, TuneResult, grid_cells
from kvmap.tune.setup import TuneSetup, build_scenario, split_screens
from kvmap.tune.space import TuneSpace

SCREENS_DIR = "screens"      # <run>/screens: the screen cells' own run


def run_tune(setup: TuneSetup, space: TuneSpace, constraints: Constraints, objective: str,
             run_dir: str | Path, *, max_cells: int, max_minutes: float | None = None,
             backend: str | CellBackend = "local", console: Console | None = None
             ) -> TuneResult:
    """Search ``space`` into ``run_dir``; returns the result (also in ``tune.json``)."""
    check_objective(objective)
    if isinstance(max_cells, bool) or not isinstance(max_cells, int) or max_cells < 1:
        raise ValueError(f"--max-cells {max_cells!r} must be a positive integer")
    if max_minutes is not None and not max_minutes > 0:
        raise ValueError(f"--max-minutes {max_minutes!r} must be more than 0")
    run_dir = Path(run_dir)
    scenario = build_scenario(setup, space, run_dir.name or "tune")
    main, screens = split_screens(scenario, setup.screen_task)
    executor = Executor([(main, run_dir), (screens, run_dir / SCREENS_DIR)],
                        max_cells=max_cells, max_minutes=max_minutes, backend=backend,
                        console=console)
    search = Search(setup, space, executor, constraints, objective)   # checks the budget
    t0 = time.perf_counter()
    result = search.run()
    rec = result.recommendation
    write_path(run_dir, result.steps, objective=objective,
               constraints=rec.to_dict()["constraints"],
               space={"kv": list(scenario.kv), "max_num_seqs": list(space.max_num_seqs)},
               recommendation={"choice": rec.choice, "feasible": rec.feasible,
                               "text": rec.lines()},
               num_cells=result.num_cells, num_cells_grid=grid_cells(scenario, space),
               max_cells=max_cells, max_minutes=max_minutes,
               wall_s=time.perf_counter() - t0, stopped=result.stopped)
    return result
