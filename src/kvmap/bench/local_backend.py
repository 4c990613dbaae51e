"""The ``local`` backend (the default): one cell at a time, each in its own process on
this machine -- a fork of a warm worker that holds the cell's model (``warm_worker``), or a
fresh process where there is none (``KVMAP_BENCH_WARM=0``, an endpoint's cell, a model
whose worker would not start)."""
from __future__ import annotations

import platform
import time
import traceback
from collections.abc import Callable, Iterator

from kvmap.bench.cell_backend import BENCH_BACKENDS, CellBackend, CellResult, FractionCallback
from kvmap.bench.cell_process import failed_record, run_cell_subprocess
from kvmap.runs.record import CellRecord
from kvmap.bench.scenario import CellSpec
from kvmap.runs.store import RunStore
from kvmap.bench.warm_worker import WarmPool, WarmWorkerError, warm_enabled


def run_cell_process(cell: CellSpec, store: RunStore, on_fraction=lambda f: None,
                     python: str | None = None, pool: WarmPool | None = None
                     ) -> tuple[CellRecord, list[dict]]:
    """One cell in a child process, its files in ``store``'s ``.work/`` and its log in
    ``store``'s ``logs/``; ``(record, rows)``. With ``pool``: a fork of its worker for
    the cell's model when it has one, else a fresh process."""
    work_dir, log_path = store.work_dir, store.log_path(cell.cell_id)
    worker = pool.worker_for(cell) if pool is not None else None
    if worker is not None:
        try:
            return worker.run(cell, work_dir, log_path, on_fraction)
        except WarmWorkerError:
            pass                    # the worker is gone before the cell began: run it cold
    kwargs = {"python": python} if python else {}
    return run_cell_subprocess(cell, work_dir, log_path, on_fraction, **kwargs)


@BENCH_BACKENDS.register
class LocalBackend(CellBackend):
    """One cell at a time, each in its own process on this machine.

    ``run_cell(cell, store, on_fraction) -> (CellRecord, rows)`` runs one cell (default:
    ``run_cell_process``); an exception from it is stored as the cell's failure."""

    name = "local"
    reads_todo_lazily = True

    def __init__(self, run_cell: Callable | None = None):
        self.run_cell = run_cell or run_cell_process
        self.pool: WarmPool | None = None

    def _extra(self) -> dict:
        """The default cell runner gets the warm workers (started on first use)."""
        if self.run_cell is not run_cell_process or not warm_enabled():
            return {}
        if self.pool is None:
            self.pool = WarmPool()
        return {"pool": self.pool}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def describe(self) -> dict:
        info = super().describe()
        if self.pool is not None:
            info["warm_workers"] = self.pool.started
        return info

    def run(self, todo: list[tuple[int, CellSpec]], store: RunStore,
            on_fraction: FractionCallback) -> Iterator[CellResult]:
        node = platform.node()
        for ordinal, cell in todo:
            on_fraction(cell, 0.0)
            t0 = time.perf_counter()
            try:
                record, rows = self.run_cell(cell, store,
                                             lambda f, cell=cell: on_fraction(cell, f),
                                             **self._extra())
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 -- the runner itself hit a problem
                record = failed_record(cell, f"{type(e).__name__}: {e}\n"
                                       f"{traceback.format_exc(limit=4)}",
                                       time.perf_counter() - t0)
                rows = []
            yield CellResult(ordinal, cell, record, rows, node=node)
