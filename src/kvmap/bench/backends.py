"""Where a scenario's cells run: the small interface the runner drives, the local backend,
and ``make_backend(name, address)``.

A backend is opened with every cell of the scenario (``open`` starts or connects to what
runs them, and raises ``ValueError`` -- before anything is stored -- when it cannot run
them), then ``run(todo, store, on_fraction)`` yields one ``CellResult`` per cell as each
one finishes, in any order; the runner stores it. ``close()`` releases what ``open``
started. A backend never raises for a failed cell (the result's record says ``failed``);
``KeyboardInterrupt`` stops its cells and propagates.

- ``local`` (the default): one cell at a time, each in its own process on this machine;
- ``ray`` (``kvmap.bench.ray_backend``, the optional ``ray`` extra): every cell a Ray task,
  on a local Ray instance or an existing cluster.
"""
from __future__ import annotations

import platform
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvmap.bench.cell_process import failed_record, run_cell_subprocess
from kvmap.bench.scenario import CellSpec
from kvmap.bench.store import RunStore

BACKENDS = ("local", "ray")

# on_fraction(cell, fraction done): progress of a running cell, when the backend knows it
FractionCallback = Callable[[CellSpec, float], None]


@dataclass
class CellResult:
    """A finished cell, as a backend hands it to the runner."""

    ordinal: int                  # the cell's position in the scenario
    cell: CellSpec
    record: dict
    rows: list[dict]
    node: str | None = None       # the machine it ran on
    log: str | None = None        # its output, when the store's log was not written yet


class CellBackend:
    """Runs cells; see the module docstring. Subclasses override ``run`` (and ``open``,
    ``close``, ``describe`` when they hold resources)."""

    name = "base"
    parallelism = 1               # how many cells run at once (for the ETA)

    def open(self, cells: list[CellSpec]) -> None:
        """Start or connect; ``ValueError`` when these cells cannot run here."""

    def run(self, todo: list[tuple[int, CellSpec]], store: RunStore,
            on_fraction: FractionCallback) -> Iterator[CellResult]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what ``open`` started (idempotent)."""

    def describe(self) -> dict:
        """What ran the cells, for ``run.json``."""
        return {"name": self.name, "parallelism": self.parallelism}

    def __enter__(self) -> CellBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_cell_process(cell: CellSpec, store: RunStore, on_fraction=lambda f: None,
                     python: str | None = None) -> tuple[dict, list[dict]]:
    """One cell in a child process, its files in ``store``'s ``.work/`` and its log in
    ``store``'s ``logs/``; ``(record, rows)``."""
    kwargs = {"python": python} if python else {}
    return run_cell_subprocess(cell, store.dir / ".work", store.log_path(cell.cell_id),
                               on_fraction, **kwargs)


class LocalBackend(CellBackend):
    """One cell at a time, each in its own process on this machine.

    ``run_cell(cell, store, on_fraction) -> (record, rows)`` runs one cell (default:
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


def make_backend(name: str, address: str | None = None) -> CellBackend:
    """The backend called ``name`` (``local`` or ``ray``); ``ValueError`` for another
    name, or an ``address`` for a backend that takes none."""
    if name == "local":
        if address:
            raise ValueError(f"--address {address!r} needs --backend ray")
        return LocalBackend()
    if name == "ray":
        from kvmap.bench.ray_backend import RayBackend      # imports ray only when opened
        return RayBackend(address=address)
    raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}")
