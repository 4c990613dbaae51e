"""Where a scenario's cells run: the small interface the runner drives, and the registry
of backends by name (``BENCH_BACKENDS``; each backend module registers its class).

A backend is opened with every cell of the scenario (``open`` starts or connects to what
runs them, and raises ``ValueError`` -- before anything is stored -- when it cannot run
them), then ``run(todo, store, on_fraction)`` yields one ``CellResult`` per cell as each
one finishes, in any order; the runner stores it. ``close()`` releases what ``open``
started. A backend never raises for a failed cell (the result's record says ``failed``);
``KeyboardInterrupt`` stops its cells and propagates.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from kvmap.runs.record import CellRecord
from kvmap.bench.scenario import CellSpec
from kvmap.runs.store import RunStore
from kvmap.registry import Registry

# on_fraction(cell, fraction done): progress of a running cell, when the backend knows it
FractionCallback = Callable[[CellSpec, float], None]


@dataclass
class CellResult:
    """A finished cell, as a backend hands it to the runner."""

    ordinal: int                  # the cell's position in the scenario
    cell: CellSpec
    record: CellRecord
    rows: list[dict]
    node: str | None = None       # the machine it ran on
    log: str | None = None        # its output, when the store's log was not written yet


class CellBackend:
    """Runs cells; see the module docstring. Subclasses override ``run`` (and ``open``,
    ``close``, ``describe`` when they hold resources)."""

    name = "base"
    parallelism = 1               # how many cells run at once (for the ETA)
    # whether ``run`` reads ``todo`` as it goes, one cell at a time (a re-plan may then
    # replace the cells not started yet: ``bench.replan``)
    reads_todo_lazily: ClassVar[bool] = False
    takes_address: ClassVar[bool] = False   # built as cls(address=...) (a cluster to join)

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


class WrappingBackend(CellBackend):
    """A backend around ``inner`` (endpoints, searches, predictions): its name, its
    parallelism, and its lifetime (``open``, ``close``, ``describe``) are the inner one's;
    a subclass adds what it does around ``inner.run``."""

    def __init__(self, inner: CellBackend):
        self.inner = inner
        self.name, self.parallelism = inner.name, inner.parallelism
        self.reads_todo_lazily = inner.reads_todo_lazily

    def open(self, cells: list[CellSpec]) -> None:
        self.inner.open(cells)

    def close(self) -> None:
        self.inner.close()

    def describe(self) -> dict:
        return self.inner.describe()


# ``--backend`` name -> backend class
BENCH_BACKENDS: Registry[type[CellBackend]] = Registry("bench backend")
