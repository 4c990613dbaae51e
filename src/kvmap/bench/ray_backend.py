"""The Ray backend: every cell of a scenario a Ray task, on this machine or a cluster.

    kvmap bench my.yaml --backend ray                       # a local Ray instance
    kvmap bench my.yaml --backend ray --address HOST:6379   # an existing Ray cluster

Without ``--address`` (and without ``RAY_ADDRESS`` in the environment, which a Ray job
has) ``open`` starts a Ray instance on this machine -- all its cores, no dashboard, a
small object store, quiet logs -- and ``close`` shuts it down; with one it connects and
leaves the cluster as it was.

Each cell is a task that declares what it needs (``cell_resources``): ``num_cpus`` (the
scenario's ``engine.num_threads``, else 1 -- Ray sets ``OMP_NUM_THREADS`` to it, so an
unset ``num_threads`` means one torch thread per cell), ``num_gpus=1`` when the cell runs
on CUDA (``engine.device: cuda``, or no device and a cluster with GPUs), and ``memory``,
an estimate (a Python+torch process, the weights, and the KV pool of a CPU cell). Ray runs
as many cells at once as these fit. A task runs the same child process as the local
backend (``kvmap.bench.cell_process``) with the same timeout, in a temporary directory on
its worker, and returns the record, the per-request rows and the log: the driver writes
the run store, so the workers need no shared filesystem (but they need kvmap installed,
and the scenario's files -- corpus, trace, ``.py`` tasks, model files other than
``smollm2`` and ``dummy:*`` -- at the same paths). Results are stored as they come, in any
order; a task that Ray itself loses (a dead node, a worker killed) is stored as a failed
cell. Ctrl-C cancels every queued and running task (each kills its cell process).

``ray`` is imported only when this backend is opened: kvmap does not need it otherwise.
"""
from __future__ import annotations

import logging
import os
import platform
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kvmap.bench.cell_backend import BENCH_BACKENDS, CellBackend, CellResult, FractionCallback
from kvmap.bench.cell_process import failed_record, run_cell_subprocess
from kvmap.runs.record import CellRecord
from kvmap.bench.scenario import CellSpec
from kvmap.runs.store import RunStore

INSTALL_HINT = "pip install 'kvmap[ray]'"
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20   # results are JSON-sized; Ray's minimum is 75 MiB
PROCESS_BYTES = 512 * 2**20              # a cell process: Python, torch, kvmap
_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
_CANCEL_WAIT_S = 5.0


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError(f"--backend ray needs Ray, which is not installed: "
                         f"{INSTALL_HINT}") from None
    return ray


def uses_gpu(cell: CellSpec, cluster_has_gpu: bool) -> bool:
    """Whether the cell runs on CUDA: asked for, or left to the engine (which picks CUDA
    when the machine has it) on a cluster with GPUs."""
    device = (cell.engine.device or "").strip().lower()
    return device.startswith("cuda") or (not device and cluster_has_gpu)


def memory_estimate(cell: CellSpec, gpu: bool) -> int | None:
    """Host bytes a cell needs: a process, its weights, and (on CPU) its KV pool; None
    when the model's shape cannot be read here."""
    from kvmap.model.loader import model_config_of
    from kvmap.config import parse_size
    try:
        config = model_config_of(cell.model.name, cell.model.dtype)
        kv = parse_size(cell.engine.kv_memory, "engine.kv_memory")
    except (ValueError, OSError):
        return None
    weights = config.num_params * _DTYPE_BYTES.get(cell.model.dtype.lower(), 4)
    return PROCESS_BYTES + weights + (0 if gpu else kv)


def cell_resources(cell: CellSpec, cluster_has_gpu: bool) -> dict:
    """The Ray task options that declare what ``cell`` needs (module docstring)."""
    gpu = uses_gpu(cell, cluster_has_gpu)
    needs = {"num_cpus": cell.engine.num_threads or 1, "num_gpus": 1 if gpu else 0}
    memory = memory_estimate(cell, gpu)
    if memory is not None:
        needs["memory"] = memory
    return needs


def run_cell_task(cell_dict: dict) -> dict:
    """The body of a cell's Ray task, on its worker: the cell in a child process, in a
    temporary directory; returns its record, rows, log and node."""
    cell = CellSpec.from_dict(cell_dict)
    with _cancellable(), tempfile.TemporaryDirectory(prefix="kvmap-cell-") as tmp:
        log_path = Path(tmp) / "cell.log"
        record, rows = run_cell_subprocess(cell, Path(tmp), log_path)
        record = record.to_dict()            # JSON over the wire, typed again below
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
    return {"record": record, "rows": rows, "log": log, "node": platform.node()}


class _cancellable:
    """Python's SIGINT handler around a task body while SIGINT is ignored: ``ray.cancel``
    raises KeyboardInterrupt in a running task through ``_thread.interrupt_main``, which
    does nothing where SIGINT is SIG_IGN -- and a worker inherits SIG_IGN when the driver
    was started with SIGINT ignored (a background job of a non-interactive shell), so a
    cancelled cell would run on to its end."""

    def __enter__(self):
        self.previous = None
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
            self.previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``host:port`` (or ``ray://host:port``) nothing listens on: Ray
    itself retries for minutes. ``auto`` and other forms are left to Ray."""
    import socket
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if "://" in rest or not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ValueError(f"cannot reach the Ray cluster at {address!r}: {e} (is `ray start "
                         "--head` running there, and is this its GCS port, 6379 by "
                         "default?)") from None


def _fits(needs: dict, nodes: list[dict]) -> bool:
    """Whether some alive node has every resource ``needs`` asks for."""
    keys = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
    for node in nodes:
        have = node.get("Resources", {})
        if node.get("Alive", True) and all(have.get(keys[k], 0) >= v
                                           for k, v in needs.items() if v):
            return True
    return False


@BENCH_BACKENDS.register
class RayBackend(CellBackend):
    """Cells as Ray tasks (module docstring). ``num_cpus`` and ``object_store_memory``
    size a local instance (default: this machine's cores, 256 MiB); they are ignored
    when connecting to a cluster."""

    name = "ray"
    takes_address = True

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 object_store_memory: int | None = None):
        self.address = address
        self.num_cpus = num_cpus
        self.object_store_memory = object_store_memory
        self.started = False            # we started the Ray instance: we shut it down
        self.cluster: dict = {}
        self.needs: dict[str, dict] = {}
        self._ray = None

    def open(self, cells: list[CellSpec]) -> None:
        ray = self._ray = _import_ray()
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if address:
            _check_reachable(address)
        if not ray.is_initialized():
            if address:
                try:
                    ray.init(address=address, logging_level=logging.ERROR,
                             log_to_driver=False)
                except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
                    raise ValueError(
                        f"cannot connect to the Ray cluster at {address!r}: {e} (a cluster "
                        "with token authentication, Ray's default, needs RAY_AUTH_MODE=token "
                        "and its token in RAY_AUTH_TOKEN or ~/.ray/auth_token)") from None
            else:
                num_cpus = self.num_cpus or len(os.sched_getaffinity(0))
                ray.init(num_cpus=num_cpus, include_dashboard=False,
                         object_store_memory=self.object_store_memory
                         or LOCAL_OBJECT_STORE_BYTES,
                         logging_level=logging.ERROR, log_to_driver=False)
                self.started = True
        try:
            self._check(cells)
        except BaseException:
            self.close()
            raise

    def _check(self, cells: list[CellSpec]) -> None:
        """Declare each cell's needs; refuse cells no node of the cluster can hold (Ray
        would queue them forever)."""
        ray = self._ray
        resources = ray.cluster_resources()
        nodes = [n for n in ray.nodes() if n.get("Alive", True)]
        has_gpu = resources.get("GPU", 0) > 0
        self.cluster = {"address": self.address or os.environ.get("RAY_ADDRESS"),
                        "local_instance": self.started, "num_nodes": len(nodes),
                        "num_cpus": resources.get("CPU", 0),
                        "num_gpus": resources.get("GPU", 0)}
        self.needs = {c.cell_id: cell_resources(c, has_gpu) for c in cells}
        for cell in cells:
            needs = self.needs[cell.cell_id]
            if needs["num_gpus"] and not has_gpu:
                raise ValueError(f"engine.device {cell.engine.device!r}: the Ray cluster has "
                                 "no GPU")
            if not _fits(needs, nodes):
                raise ValueError(
                    f"cell {cell.cell_id} needs {_fmt_needs(needs)}, more than any node of "
                    f"the Ray cluster has ({self.cluster['num_nodes']} node(s), "
                    f"{self.cluster['num_cpus']:g} CPUs, {self.cluster['num_gpus']:g} GPUs "
                    "in all); lower engine.num_threads or kv_memory")
        per_cell = max((n["num_cpus"] for n in self.needs.values()), default=1)
        slots = int(self.cluster["num_cpus"] // per_cell)
        if any(n["num_gpus"] for n in self.needs.values()):
            slots = min(slots, int(self.cluster["num_gpus"]))
        self.parallelism = max(1, slots)

    def run(self, todo: list[tuple[int, CellSpec]], store: RunStore,
            on_fraction: FractionCallback) -> Iterator[CellResult]:
        ray = self._ray
        task = ray.remote(run_cell_task)
        pending: dict = {}
        try:
            for ordinal, cell in todo:
                needs = self.needs.get(cell.cell_id) or cell_resources(
                    cell, self.cluster.get("num_gpus", 0) > 0)
                ref = task.options(name=f"kvmap-cell:{cell.cell_id}", max_retries=1,
                                   **needs).remote(cell.to_dict())
                pending[ref] = (ordinal, cell, time.perf_counter())
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    ordinal, cell, t0 = pending.pop(ref)
                    try:
                        out = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 -- Ray lost the task
                        yield CellResult(ordinal, cell, failed_record(
                            cell, f"the Ray task failed: {type(e).__name__}: {e}",
                            time.perf_counter() - t0), [])
                        continue
                    yield CellResult(ordinal, cell, CellRecord.from_dict(out["record"]),
                                     out["rows"],
                                     node=out["node"], log=out["log"])
        finally:
            if pending:
                self._cancel(list(pending))

    def _cancel(self, refs: list) -> None:
        """Cancel tasks (a running one gets KeyboardInterrupt and kills its cell process)
        and give them a moment to end."""
        ray = self._ray
        for ref in refs:
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001 -- already finished or gone
                pass
        try:
            ray.wait(refs, num_returns=len(refs), timeout=_CANCEL_WAIT_S)
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        if self.started and self._ray is not None:
            self._ray.shutdown()
        self.started = False

    def describe(self) -> dict:
        return {"name": self.name, **self.cluster, "parallelism": self.parallelism}


def _fmt_needs(needs: dict) -> str:
    from kvmap.config import format_bytes
    parts = [f"{needs['num_cpus']} CPU(s)"]
    if needs.get("num_gpus"):
        parts.append(f"{needs['num_gpus']} GPU")
    if needs.get("memory"):
        parts.append(f"{format_bytes(needs['memory'])} memory")
    return ", ".join(parts)
