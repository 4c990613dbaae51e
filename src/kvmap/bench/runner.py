"""Run every cell of a scenario, each in its own process, into a run directory.

``run_scenario(scenario, run_dir)`` walks ``scenario.cells()`` in order:

- a cell already stored in ``run_dir`` is skipped (resume); ``retry_failed=True`` reruns
  the ones stored as failed;
- each other cell runs as ``python -m kvmap.bench.cell`` (so its peak memory is its own),
  with the cell's ``timeout_s``; its record and rows are stored as soon as it ends;
- a cell that fails -- an exception, a crash, a timeout -- is stored as failed with its
  error, and the run goes on;
- Ctrl-C kills the running cell, stores nothing for it, and re-raises
  ``KeyboardInterrupt``: the same command with the same ``--out`` resumes.

Progress: one bar over the cells with an ETA, one bar for the running cell (its fraction
of requests done). The ETA assumes a cell costs what finished cells of the same workload
or task cost (cells run KV config by KV config, so it is right after the first one).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                           TextColumn, TimeElapsedColumn)

from kvmap.bench.cell import PROGRESS_PREFIX, RECORD_SCHEMA
from kvmap.bench.scenario import CellSpec, Scenario, scenario_text
from kvmap.bench.store import RunStore


@dataclass
class RunResult:
    run_dir: Path
    cells: list[dict]             # every stored record, in scenario order
    num_ran: int
    num_skipped: int
    num_failed: int               # among all stored cells
    resumed: bool
    duration_s: float


def default_run_dir(scenario: Scenario, root: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{scenario.name}-{stamp}"


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class _Eta:
    """Remaining time: each cell costs the mean of finished cells of its job (else of all)."""

    def __init__(self, cells: list[CellSpec]):
        self.remaining = list(cells)
        self.durations: dict[str, list[float]] = {}

    def finished(self, cell: CellSpec, duration_s: float) -> None:
        self.remaining.remove(cell)
        self.durations.setdefault(cell.job, []).append(duration_s)

    def skipped(self, cell: CellSpec) -> None:
        self.remaining.remove(cell)

    def seconds(self, running_s: float = 0.0) -> float | None:
        every = [d for ds in self.durations.values() for d in ds]
        if not every:
            return None
        total = 0.0
        for cell in self.remaining:
            ds = self.durations.get(cell.job) or every
            total += sum(ds) / len(ds)
        return max(0.0, total - running_s)


def _failed_record(cell: CellSpec, error: str, duration_s: float) -> dict:
    return {"schema": RECORD_SCHEMA, "cell_id": cell.cell_id, "kind": cell.kind,
            "model": cell.model.name, "dtype": cell.model.dtype, "kv": cell.kv,
            "workload": cell.workload.name if cell.workload else None,
            "task": cell.task.name if cell.task else None,
            "params": cell.workload.options if cell.workload else cell.task.params,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "status": "failed", "error": error, "warnings": [], "metrics": {},
            "details": {}, "duration_s": duration_s}


def _child_env() -> dict:
    """The cell process imports what this one does (``module:function`` tasks included).

    ``OMP_WAIT_POLICY=PASSIVE`` (unless set): OpenMP threads that spin at barriers are a
    disaster on a shared machine -- with one core busy elsewhere, a 2-thread torch ran a
    long-context cell 5-10x slower than 1 thread; passive waiting ran it as fast as 1
    thread there, and keeps both threads' worth on an idle machine."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_cell_process(cell: CellSpec, store: RunStore, on_fraction=lambda f: None,
                     python: str = sys.executable) -> tuple[dict, list[dict]]:
    """Run one cell in a child process; ``(record, rows)``. Never raises for a cell
    failure; ``KeyboardInterrupt`` kills the child and propagates."""
    work = store.dir / ".work"
    work.mkdir(exist_ok=True)
    cell_path, result_path = work / f"{cell.cell_id}.cell.json", work / f"{cell.cell_id}.out.json"
    cell_path.write_text(json.dumps(cell.to_dict()))
    result_path.unlink(missing_ok=True)
    log_path = store.log_path(cell.cell_id)
    log_path.parent.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, "-m", "kvmap.bench.cell", str(cell_path),
                                 str(result_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=_child_env())

        def pump() -> None:               # progress lines -> callback, the rest -> log
            for line in proc.stdout:
                if line.startswith(PROGRESS_PREFIX):
                    try:
                        on_fraction(json.loads(line[len(PROGRESS_PREFIX):])["fraction"])
                    except (ValueError, KeyError):
                        pass
                else:
                    log.write(line)
                    log.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            while proc.poll() is None:
                if cell.timeout_s is not None and time.perf_counter() - t0 > cell.timeout_s:
                    proc.kill()
                    timed_out = True
                    break
                time.sleep(0.1)
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        reader.join(timeout=5)
    duration_s = time.perf_counter() - t0
    cell_path.unlink(missing_ok=True)
    if timed_out:
        result_path.unlink(missing_ok=True)
        return _failed_record(cell, f"timed out after {cell.timeout_s:g} s (cell_timeout_s)",
                              duration_s), []
    if proc.returncode == 0 and result_path.is_file():
        result = json.loads(result_path.read_text())
        result_path.unlink()
        return result["record"], result["rows"]
    tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:]).strip()
    return _failed_record(cell, f"cell process exited with code {proc.returncode}"
                                f"{': ' + tail if tail else ''}", duration_s), []


def run_scenario(scenario: Scenario, run_dir: str | Path | None = None, *,
                 console: Console | None = None, retry_failed: bool = False,
                 show_progress: bool = True, command: list[str] | None = None) -> RunResult:
    """Run (or resume) ``scenario`` into ``run_dir``; see the module docstring."""
    t_start = time.perf_counter()
    console = console or Console(stderr=True)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(scenario)
    store, resumed = RunStore.open_for(run_dir, scenario, scenario_text(scenario), command)
    cells = scenario.cells()
    stored = {c["cell_id"]: c for c in store.cells()}
    skip = {cid for cid, c in stored.items() if c["status"] == "ok" or not retry_failed}
    eta = _Eta(cells)
    for cell in cells:
        if cell.cell_id in skip:
            eta.skipped(cell)
    todo = [(i, c) for i, c in enumerate(cells) if c.cell_id not in skip]
    if resumed:
        console.print(f"resuming {run_dir}: {len(cells) - len(todo)} of {len(cells)} cells "
                      "already done")
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("ETA {task.fields[eta]}"), console=console,
                        # a log file or CI gets plain lines, printed as cells end
                        disable=not show_progress or not console.is_terminal,
                        transient=False)
    num_ran = 0
    try:
        with progress:
            overall = progress.add_task("cells", total=len(cells),
                                        completed=len(cells) - len(todo), eta="?")
            current = progress.add_task("", total=1.0, eta="", visible=False)
            for n, (ordinal, cell) in enumerate(todo, start=1):
                label = f"{cell.kv} | {cell.job}"
                t_cell = time.perf_counter()
                progress.update(current, description=label, completed=0.0, visible=True)

                def on_fraction(f: float, t_cell=t_cell) -> None:
                    progress.update(current, completed=min(1.0, f))
                    progress.update(overall, eta=_fmt_s(eta.seconds(
                        time.perf_counter() - t_cell)))

                try:
                    record, rows = run_cell_process(cell, store, on_fraction)
                except KeyboardInterrupt:
                    raise
                except Exception as e:  # noqa: BLE001 -- the runner itself hit a problem
                    record = _failed_record(cell, f"{type(e).__name__}: {e}\n"
                                            f"{traceback.format_exc(limit=4)}",
                                            time.perf_counter() - t_cell)
                    rows = []
                store.write_cell(record, rows, ordinal)
                num_ran += 1
                eta.finished(cell, record.get("duration_s") or time.perf_counter() - t_cell)
                progress.update(overall, advance=1, eta=_fmt_s(eta.seconds()))
                mark = "[green]ok[/]" if record["status"] == "ok" else "[red]FAILED[/]"
                remaining = f", ETA {_fmt_s(eta.seconds())}" if n < len(todo) else ""
                console.print(f"[{len(cells) - len(todo) + n}/{len(cells)}] {mark} "
                              f"{cell.model.name} | {label} "
                              f"({_fmt_s(record.get('duration_s'))}{remaining})")
                if record["status"] != "ok":
                    console.print(f"    [red]{str(record['error']).splitlines()[0][:300]}[/]"
                                  f"  (log: {store.log_path(cell.cell_id)})")
            progress.update(current, visible=False)
    finally:
        store.finalize(interrupted=num_ran < len(todo))
        try:
            (store.dir / ".work").rmdir()          # only when empty
        except OSError:
            pass
    records = store.cells()
    return RunResult(run_dir=run_dir, cells=records, num_ran=num_ran,
                     num_skipped=len(cells) - len(todo),
                     num_failed=sum(c["status"] != "ok" for c in records), resumed=resumed,
                     duration_s=time.perf_counter() - t_start)
