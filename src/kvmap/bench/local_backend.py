"""The ``local`` backend (the default): one cell at a time, each in its own process on
this machine."""
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


def run_cell_process(cell: CellSpec, store: RunStore, on_fraction=lambda f: None,
                     python: str | None = None) -> tuple[CellRecord, list[dict]]:
    """One cell in a child process, its files in ``store``'s ``.work/`` and its log in
    ``store``'s ``logs/``; ``(record, rows)``."""
    kwargs = {"python": python} if python else {}
    return run_cell_subprocess(cell, store.work_dir, store.log_path(cell.cell_id),
                               on_fraction, **kwargs)


@BENCH_BACKENDS.register
class LocalBackend(CellBackend):
    """One cell at a time, each in its own process on this machine.

    ``run_cell(cell, store, on_fraction) -> (CellRecord, rows)`` runs one cell (default:
    ``run_cell_process``); an exception from it is stored as the cell's failure."""

    name = "local"

    def __init__(self, run_cell: Callable | None = None):
        self.run_cell = run_cell or run_cell_process

    def run(self, todo: list[tuple[int, CellSpec]], store: RunStore,
            on_fraction: FractionCallback) -> Iterator[CellResult]:
        node = platform.node()
        for ordinal, cell in todo:
            on_fraction(cell, 0.0)
            t0 = time.perf_counter()
            try:
                record, rows = self.run_cell(cell, store,
                                             lambda f, cell=cell: on_fraction(cell, f))
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 -- the runner itself hit a problem
                record = failed_record(cell, f"{type(e).__name__}: {e}\n"
                                       f"{traceback.format_exc(limit=4)}",
                                       time.perf_counter() - t0)
                rows = []
            yield CellResult(ordinal, cell, record, rows, node=node)
