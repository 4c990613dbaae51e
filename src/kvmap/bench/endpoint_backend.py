"""Endpoint cells beside any backend: ``with_endpoints(backend, cells)`` hands the
in-process cells to ``backend`` and runs the endpoints' cells here, one endpoint at a
time, its server launched around them (``endpoint_launch``).

Each endpoint cell runs like any other, in its own process (``run_cell_process``), with
the endpoint's real URL in its spec (its ``cell_id`` is the one of the scenario, so a
resumed run finds it). The server's output goes to ``logs/endpoint-<name>.log``; what it
wrote while a cell ran is appended to that cell's log. A server that cannot start, or
that exits while its cells run, fails the cells left -- each record names the endpoint
and the cause -- and the run goes on with the next endpoint.
"""
from __future__ import annotations

import platform
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from kvmap.bench.cell_backend import (CellBackend, CellResult, FractionCallback,
                                     WrappingBackend)
from kvmap.bench.cell_process import failed_record
from kvmap.bench.cellspec import CellSpec
from kvmap.bench.endpoint_launch import EndpointLaunchError, Launched, launched
from kvmap.runs.store import RunStore


class EndpointBackend(WrappingBackend):
    """``inner`` runs the in-process cells; the endpoint cells run here, after them."""

    def __init__(self, inner: CellBackend, run_cell: Callable):
        super().__init__(inner)
        self.reads_todo_lazily = False        # ``run`` splits ``todo`` into copies
        self.run_cell = run_cell

    def open(self, cells: list[CellSpec]) -> None:
        self.inner.open([c for c in cells if c.endpoint is None])

    def run(self, todo: list[tuple[int, CellSpec]], store: RunStore,
            on_fraction: FractionCallback) -> Iterator[CellResult]:
        mine = [(i, c) for i, c in todo if c.endpoint is not None]
        rest = [(i, c) for i, c in todo if c.endpoint is None]
        if rest:
            yield from self.inner.run(rest, store, on_fraction)
        groups: dict[str, list[tuple[int, CellSpec]]] = {}
        for i, c in mine:
            groups.setdefault(c.endpoint.name, []).append((i, c))
        for group in groups.values():
            yield from self._run_endpoint(group, store, on_fraction)

    def _run_endpoint(self, group: list[tuple[int, CellSpec]], store: RunStore,
                      on_fraction: FractionCallback) -> Iterator[CellResult]:
        entry = group[0][1].endpoint
        log_path = server_log_path(store, entry.name)
        done = 0
        t0 = time.perf_counter()
        try:
            with launched(entry, log_path) as server:
                for ordinal, cell in group:
                    code = server.exit_code()
                    if code is not None:
                        raise EndpointLaunchError(f"the server exited with code {code} "
                                                  "during an earlier cell")
                    yield self._one(ordinal, cell, server, store, on_fraction, log_path)
                    done += 1
                    t0 = time.perf_counter()
        except EndpointLaunchError as e:
            for ordinal, cell in group[done:]:
                error = f"endpoint {entry.name!r}: {e}"
                yield CellResult(ordinal, cell, failed_record(cell, error,
                                                              time.perf_counter() - t0), [],
                                 node=platform.node(),
                                 log=f"{error}\n(server log: {log_path})\n")

    def _one(self, ordinal: int, cell: CellSpec, server: Launched, store: RunStore,
             on_fraction: FractionCallback, log_path) -> CellResult:
        on_fraction(cell, 0.0)
        start = log_path.stat().st_size if log_path.is_file() else 0
        resolved = replace(cell, endpoint=server.entry)
        t0 = time.perf_counter()
        try:
            record, rows = self.run_cell(resolved, store,
                                         lambda f: on_fraction(cell, f))
        except Exception as e:  # noqa: BLE001 -- stored as the cell's failure
            record, rows = failed_record(cell, f"endpoint {cell.endpoint.name!r}: "
                                         f"{type(e).__name__}: {e}",
                                         time.perf_counter() - t0), []
        _append_server_output(store.log_path(cell.cell_id), log_path, start)
        return CellResult(ordinal, cell, record, rows, node=platform.node())


def server_log_path(store: RunStore, name: str):
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "endpoint"
    return store.dir / "logs" / f"endpoint-{slug}.log"


def _append_server_output(cell_log, server_log, start: int) -> None:
    """What the server wrote during the cell, after the cell's own output."""
    if not server_log.is_file():
        return
    with open(server_log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    if text:
        cell_log.parent.mkdir(parents=True, exist_ok=True)
        with open(cell_log, "a") as log:
            log.write(f"\n--- server output during this cell ({server_log.name}) ---\n"
                      f"{text}")


def with_endpoints(backend: CellBackend, cells: list[CellSpec],
                   run_cell: Callable | None = None) -> CellBackend:
    """``backend`` itself when no cell is an endpoint's, else the two together."""
    if not any(c.endpoint is not None for c in cells):
        return backend
    if run_cell is None:
        from kvmap.bench.local_backend import run_cell_process
        run_cell = getattr(backend, "run_cell", None) or run_cell_process
    return EndpointBackend(backend, run_cell)
