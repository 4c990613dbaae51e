"""The bench backends by name: importing this module registers every one in
``BENCH_BACKENDS`` (``cell_backend.py``), and ``make_backend(name, address)`` builds one.

- ``local`` (the default, ``local_backend.py``): one cell at a time, each in its own
  process on this machine;
- ``ray`` (``ray_backend.py``, the optional ``ray`` extra): every cell a Ray task, on a
  local Ray instance or an existing cluster (``ray`` itself is imported only when opened).

A new backend is one module with a ``@BENCH_BACKENDS.register`` class, imported here.
"""
from __future__ import annotations

from kvmap.bench import local_backend, ray_backend  # noqa: F401  (they register)
from kvmap.bench.cell_backend import BENCH_BACKENDS, CellBackend, CellResult, FractionCallback
from kvmap.bench.local_backend import LocalBackend, run_cell_process

__all__ = ["BENCH_BACKENDS", "CellBackend", "CellResult", "FractionCallback",
           "LocalBackend", "make_backend", "run_cell_process"]


def make_backend(name: str, address: str | None = None) -> CellBackend:
    """The backend registered as ``name``; ``ValueError`` for another name, or an
    ``address`` for a backend that takes none."""
    if name not in BENCH_BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid backends: "
                         f"{', '.join(BENCH_BACKENDS)}")
    cls = BENCH_BACKENDS[name]
    if cls.takes_address:
        return cls(address=address)
    if address:
        joiners = [n for n, member in BENCH_BACKENDS.items() if member.takes_address]
        raise ValueError(f"--address {address!r} needs --backend {' or '.join(joiners)}")
    return cls()
