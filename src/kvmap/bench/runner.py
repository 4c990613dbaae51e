"""Run every cell of a scenario, each in its own process, into a run directory.

``run_scenario(scenario, run_dir, backend=...)`` takes ``scenario.cells()`` in order:

- a cell already stored in ``run_dir`` is skipped (resume); ``retry_failed=True`` reruns
  the ones stored as failed;
- the others go to a backend (``kvmap.bench.backends``): ``local`` runs them one at a time
  here, ``ray`` as Ray tasks, many at once, here or on a cluster. Either way a cell runs
  as ``python -m kvmap.bench.cell`` (so its peak memory is its own) with the cell's
  ``timeout_s``, and its record and rows are stored here as soon as it ends;
- a cell that fails -- an exception, a crash, a timeout, a lost Ray task -- is stored as
  failed with its error, and the run goes on;
- Ctrl-C kills the running cell(s), stores nothing for them, and re-raises
  ``KeyboardInterrupt``: the same command with the same ``--out`` resumes.

Progress: one bar over the cells with an ETA, one bar for the running cell (its fraction
of requests done; local backend only). The ETA assumes a cell costs what finished cells of
the same workload or task cost (cells run KV config by KV config, so it is right after the
first one), divided among the cells the backend runs at once.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                           TextColumn, TimeElapsedColumn)

from kvmap.bench.backends import CellBackend, LocalBackend, make_backend, run_cell_process
from kvmap.bench.endpoint_backend import with_endpoints
from kvmap.bench.predicting_backend import with_predictions
from kvmap.runs.record import CellRecord
from kvmap.bench.scenario import CellSpec, Scenario, scenario_text
from kvmap.runs.store import RunLock, RunStore
from kvmap.kv.redact import redact_spec
from kvmap.bench.timeseries import write_timeseries
from kvmap.bench.duration import fmt_duration


@dataclass
class RunResult:
    run_dir: Path
    cells: list[CellRecord]       # every stored record, in scenario order
    num_ran: int
    num_skipped: int
    num_failed: int               # among all stored cells ("unavailable" is not failed)
    resumed: bool
    duration_s: float


def default_run_dir(scenario: Scenario, root: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    if "/" in scenario.name or "\\" in scenario.name or scenario.name.startswith("."):
        raise ValueError(f"scenario name {scenario.name!r} is not a plain file name")
    return Path(root) / f"{scenario.name}-{stamp}"


class _Eta:
    """Remaining time: each cell costs the mean of finished cells of its job (else of all);
    with an estimate (``bench.estimate``), a job not seen yet costs its estimate scaled by
    the ratio of actual to estimated time of the cells done so far."""

    def __init__(self, cells: list[CellSpec], parallelism: int = 1, estimate=None):
        self.remaining = list(cells)
        self.parallelism = max(1, parallelism)
        self.durations: dict[str, list[float]] = {}
        self.estimate, self.ratio = estimate, [0.0, 0.0]      # actual, estimated
        ids = {c.cell_id for c in cells}       # a search's probes, as estimated
        self.extra = [e for e in (estimate.cells if estimate else ()) if e.cell_id not in ids]

    def finished(self, cell: CellSpec, duration_s: float) -> None:
        if cell in self.remaining:
            self.remaining.remove(cell)
        else:                              # a search's probe: one of its estimates is done
            same = [e for e in self.extra if e.family == getattr(cell.workload, "name", None)]
            if same:
                self.extra.remove(next((e for e in same if e.cell_id == cell.cell_id), same[0]))
        self.durations.setdefault(cell.job, []).append(duration_s)
        est = self.estimate.of(cell.cell_id) if self.estimate is not None else None
        if est is not None:
            self.ratio[0] += duration_s
            self.ratio[1] += est.seconds

    def skipped(self, cell: CellSpec) -> None:
        self.remaining.remove(cell)

    def _guess(self, cell: CellSpec) -> float | None:
        est = self.estimate.of(cell.cell_id) if self.estimate is not None else None
        if est is None:
            return None
        return est.seconds * (self.ratio[0] / self.ratio[1] if self.ratio[1] else 1.0)

    def seconds(self, running_s: float = 0.0) -> float | None:
        every = [d for ds in self.durations.values() for d in ds]
        if not every and self.estimate is None:
            return None
        total = 0.0
        for cell in self.remaining:
            ds = self.durations.get(cell.job)
            guess = self._guess(cell) if not ds else None
            ds = ds or every
            total += guess if guess is not None else sum(ds) / len(ds) if ds else 0.0
        scale = self.ratio[0] / self.ratio[1] if self.ratio[1] else 1.0
        total += scale * sum(e.seconds for e in self.extra)
        return max(0.0, total / min(self.parallelism, max(1, len(self.remaining)))
                   - running_s)


def run_scenario(scenario: Scenario, run_dir: str | Path | None = None, *,
                 console: Console | None = None, retry_failed: bool = False,
                 show_progress: bool = True, command: list[str] | None = None,
                 backend: str | CellBackend = "local", address: str | None = None,
                 cells: list[CellSpec] | None = None, estimate=None,
                 searches: bool | None = None, predict=None, replan=None,
                 left_out: set[str] = frozenset()) -> RunResult:
    """Run (or resume) ``scenario`` into ``run_dir``; see the module docstring.

    ``backend``: ``"local"`` (each cell in its own process here, one at a time),
    ``"ray"`` (cells as Ray tasks; ``address`` names an existing cluster), or a
    ``CellBackend``. ``ValueError`` -- before anything is stored -- for a backend that
    cannot run the scenario's cells. ``cells``: run only these (default
    ``scenario.cells()``); a search (``kvmap tune``) runs its cells a few at a time.
    Without ``cells`` (or with ``searches=True``), the scenario's ``arrival: auto``
    searches run after its cells (``search_backend``), but those whose template's id is
    in ``left_out`` (a budget's: optional, or a probe would pass its cell timeout). ``estimate`` (``bench.estimate.RunEstimate``): each record gets
    its cell's estimate beside its actual wall time (``estimate``), and the ETA uses it.
    ``replan`` (``bench.replan.Replanner``): after each cell, the cells not started yet
    are re-sized when the run is off its budget's course (a backend that
    ``reads_todo_lazily`` only: the others have their cells already); run.json's
    ``replan`` says what it did."""
    t_start = time.perf_counter()
    console = console or Console(stderr=True)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(scenario)
    searching = cells is None if searches is None else searches
    cells = scenario.cells() if cells is None else list(cells)
    if backend == "local" and not address:
        backend = LocalBackend(run_cell_process)      # looked up now: tests replace it
    elif isinstance(backend, str):
        backend = make_backend(backend, address)
    backend = with_endpoints(backend, cells)      # endpoint cells run here, beside it
    if searching:
        from kvmap.bench.search_backend import with_searches
        time_left = sized = None
        if replan is not None:              # the searches held to the budget as they run
            plan = replan

            def time_left() -> float:
                return (plan.budget_s - plan.spent_before_s - plan.reserve_s
                        - (time.perf_counter() - t_start))
            sized = plan.sized_scenario
        backend = with_searches(backend, scenario, cells, retry_failed, predict,
                                time_left, sized, left_out)
    backend = with_predictions(backend, predict)
    backend.open(cells)
    with backend, RunLock(run_dir), _thread_settings(backend, console) as settings:
        if not backend.reads_todo_lazily or estimate is None:
            replan = None
        return _run_cells(scenario, cells, run_dir, backend, console, retry_failed,
                          show_progress, command, t_start, settings, estimate, replan)


@contextmanager
def _thread_settings(backend: CellBackend, console: Console):
    """The wait policy this run's local cells get, measured now (``kvmap.hardware.threads``;
    a user's ``OMP_WAIT_POLICY`` is kept), in the environment while the run lasts."""
    if backend.name != "local":
        yield None
        return
    from kvmap.bench.cell_process import CELL_WAIT_POLICY_ENV
    from kvmap.hardware.threads import choose
    settings = choose(given=os.environ.get(CELL_WAIT_POLICY_ENV))
    times = ", ".join(f"{p} {s * 1e3:.1f} ms" for p, s in settings.step_s.items())
    console.print(f"cell threads: {settings.num_threads}, OpenMP wait policy "
                  f"{settings.wait_policy} ({settings.source}"
                  f"{': decode-step proxy ' + times if times else ''})")
    previous = os.environ.get(CELL_WAIT_POLICY_ENV)
    os.environ[CELL_WAIT_POLICY_ENV] = settings.wait_policy
    try:
        yield settings
    finally:
        if previous is None:
            os.environ.pop(CELL_WAIT_POLICY_ENV, None)
        else:
            os.environ[CELL_WAIT_POLICY_ENV] = previous


def _run_cells(scenario: Scenario, cells: list[CellSpec], run_dir: Path, backend: CellBackend,
               console: Console, retry_failed: bool, show_progress: bool,
               command: list[str] | None, t_start: float, settings=None,
               estimate=None, replan=None) -> RunResult:
    store, resumed = RunStore.open_for(run_dir, scenario, scenario_text(scenario), command)
    store.clear_work()          # a killed run's cell files (a spec may name secrets' places)
    stored = {c.cell_id: c for c in store.cells()}
    skip = {cid for cid, c in stored.items() if c.ok or not retry_failed}
    eta = _Eta([c for c in cells if c.cell_id not in skip], backend.parallelism, estimate)
    total = len(cells) + getattr(backend, "max_extra_cells", 0)    # a search: at most
    todo = [(i, c) for i, c in enumerate(cells) if c.cell_id not in skip]
    if resumed:
        console.print(f"resuming {escape(str(run_dir))}: {len(cells) - len(todo)} of {len(cells)} cells "
                      "already done")
    if backend.name != "local":
        console.print(f"backend {backend.name}: {_describe(backend.describe())}")
    progress = _progress(console, show_progress)
    num_ran = 0
    try:
        with progress:
            overall = progress.add_task("cells", total=total,
                                        completed=len(cells) - len(todo), eta="?")
            current = progress.add_task("", total=1.0, eta="", visible=False)
            started: dict[str, float] = {}

            def on_fraction(cell: CellSpec, f: float) -> None:
                if cell.cell_id not in started:            # a cell starts: its own bar
                    started[cell.cell_id] = time.perf_counter()
                    progress.update(current, description=escape(_label(cell)), completed=0.0,
                                    visible=True)
                progress.update(current, completed=min(1.0, f))
                progress.update(overall, eta=fmt_duration(eta.seconds(
                    time.perf_counter() - started[cell.cell_id])))

            t_run = time.perf_counter()
            for n, result in enumerate(backend.run(todo, store, on_fraction), start=1):
                cell, record, rows = result.cell, result.record, result.rows
                if result.node is not None:
                    record.env = {**(record.env or {}), "backend": backend.name,
                                  "node": result.node}
                if result.log is not None:
                    store.write_log(cell.cell_id, result.log)
                t_cell = started.pop(cell.cell_id, t_run)
                _beside_estimate(record, estimate, cell, wall_s := time.perf_counter() - t_cell)
                write_timeseries(store.dir, record)     # the series goes beside the rows
                store.write_cell(record, rows, result.ordinal)
                num_ran += 1
                eta.finished(cell, record.duration_s or time.perf_counter() - t_cell)
                progress.update(overall, advance=1, eta=fmt_duration(eta.seconds()))
                mark = {"ok": "[green]ok[/]", "unavailable": "[yellow]unavailable[/]"}.get(
                    record.status, "[red]FAILED[/]")
                remaining = f", ETA {fmt_duration(eta.seconds())}" if eta.remaining or eta.extra else ""
                where = f" on {result.node}" if backend.name != "local" and result.node else ""
                # every text from outside (specs, errors, paths) is escaped: a "[/" in an
                # error message must not crash the run after the cell was stored
                console.print(f"[{len(cells) - len(todo) + n}/{total}] {mark} "
                              f"{escape(cell.model.name)} | {escape(_label(cell))} "
                              f"({fmt_duration(record.duration_s)}{escape(where)}"
                              f"{remaining})")
                if not record.ok:
                    error = redact_spec(str(record.error) or "?").splitlines()[0][:300]
                    console.print(f"    [red]{escape(error)}[/]"
                                  f"  (log: {escape(str(store.log_path(cell.cell_id)))})")
                if replan is not None:
                    estimate = _replan(replan, scenario, todo, n, cell, estimate, eta,
                                       wall_s, time.perf_counter() - t_start, console)
            progress.update(current, visible=False)
    finally:
        store.finalize(interrupted=num_ran < len(todo), backend=backend.describe(),
                       thread_settings=settings and settings.to_dict(),
                       **({"replan": replan.to_dict()} if replan is not None else {}))
        try:
            store.work_dir.rmdir()                 # only when empty
        except OSError:
            pass
    records = store.cells()
    return RunResult(run_dir=run_dir, cells=records, num_ran=num_ran,
                     num_skipped=len(cells) - len(todo),
                     num_failed=sum(c.status == "failed" for c in records), resumed=resumed,
                     duration_s=time.perf_counter() - t_start)


def _replan(replan, scenario: Scenario, todo: list, num_done: int, cell, estimate,
            eta: _Eta, wall_s: float, elapsed_s: float, console: Console):
    """Time ``cell``, just done, into ``replan`` and, when the run is off course, re-size
    the cells not started yet (``todo[num_done:]``, replaced in place: the local backend
    reads the list as it goes); the estimate the rest of the run uses. A search's probes
    come after ``todo`` (the searching backend yields them): nothing of ``todo`` is left
    to re-size then."""
    est = estimate.of(cell.cell_id) if estimate is not None else None
    replan.cell_done(est.seconds if est is not None else None, wall_s)
    index = {c.cell_id: i for i, c in enumerate(scenario.cells())}
    rest = [(k, index[c.cell_id]) for k, (_, c) in enumerate(todo)
            if k >= num_done and c.cell_id in index]
    plan, new = replan.after(elapsed_s, [i for _, i in rest])
    if plan is None:
        return estimate
    console.print(escape(plan.line()))
    added = []
    for k, i in rest:
        ordinal, old = todo[k]
        cell, cell_est = new[i]
        todo[k] = (ordinal, cell)
        if old in eta.remaining:
            eta.remaining[eta.remaining.index(old)] = cell
        if cell_est is not None:
            added.append(cell_est)
    estimate = replace(estimate, cells=tuple(estimate.cells) + tuple(added))
    eta.estimate = estimate
    return estimate


def _progress(console: Console, show_progress: bool) -> Progress:
    """The run's bars; a log file or CI gets plain lines, printed as cells end."""
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA {task.fields[eta]}"), console=console,
                    disable=not show_progress or not console.is_terminal, transient=False)


def _beside_estimate(record: CellRecord, estimate, cell: CellSpec, wall_s: float) -> None:
    """The cell's estimate and its actual wall time here (start-up included), side by side;
    a probe of a search (not in the estimate) gets its actual time alone."""
    if estimate is None:
        return
    est = estimate.of(cell.cell_id)
    record.estimate = {**(est.to_dict() if est is not None else {"estimate_s": None}),
                          "actual_s": round(wall_s, 2)}


def _label(cell: CellSpec) -> str:
    return redact_spec(f"{cell.kv} | {cell.job}")


def _describe(info: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in info.items() if k != "name" and v is not None)
