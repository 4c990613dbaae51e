"""Each workload cell's prediction beside its measurement: ``with_predictions(backend,
predict)`` wraps any backend so that every cell result that is an ok workload cell gets
``record["prediction"] = predict(cell, record, rows)`` before the runner stores it.

``predict`` comes from the command that starts the run (``kvmap bench`` hands it
``kvmap.plan.sim.predict.CellPredictor``): the planner sits above the bench, so the
bench's machinery never imports it and takes the predictor as a plain callable. With
the local backend it runs between two cells (the next one starts when the runner asks
for it), so it never shares the machine with a measurement.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from kvmap.bench.cell_backend import (CellBackend, CellResult, FractionCallback,
                                     WrappingBackend)
from kvmap.bench.cellspec import CellSpec
from kvmap.runs.store import RunStore

Predict = Callable[[CellSpec, dict, list], dict]


class PredictingBackend(WrappingBackend):
    """``inner``'s results, each ok workload cell's record with its ``prediction``."""

    def __init__(self, inner: CellBackend, predict: Predict):
        super().__init__(inner)
        self.predict = predict

    def __getattr__(self, name: str):          # run_cell and the like: the inner one's
        return getattr(self.inner, name)

    def run(self, todo: list[tuple[int, CellSpec]], store: RunStore,
            on_fraction: FractionCallback) -> Iterator[CellResult]:
        for result in self.inner.run(todo, store, on_fraction):
            if result.cell.kind == "workload" and result.record.ok:
                result.record.prediction = self.predict(result.cell, result.record.to_dict(),
                                                        result.rows)
            yield result


def with_predictions(backend: CellBackend, predict: Predict | None) -> CellBackend:
    """``backend`` itself without ``predict``, else wrapped (module docstring)."""
    return backend if predict is None else PredictingBackend(backend, predict)
