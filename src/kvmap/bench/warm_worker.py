"""A warm worker per model: each cell runs in a fork of a process that already imported
kvmap and loaded the weights, so a cell stops paying the start-up a fresh process pays
(the interpreter, torch and kvmap imports, the weights read from the cache) and keeps the
isolation of a process of its own (a crash, a leak, a timeout stays in its cell).

    runner ---- one JSON line per cell ----> worker (``python -m kvmap.bench.warm_worker``)
      ^                                        | imports; loads (model, dtype, device) once
      |                                        | (``kvmap.model.preload``), one thread
      +---- its stdout: the cells' output  ----+-- fork --> cell: own session, OOM score,
            and control lines                                RLIMIT_AS, threads restored,
                                                             ``kvmap.bench.cell.main``, _exit

The worker never runs an OpenMP parallel region (``torch.set_num_threads(1)`` before any
work): GNU OpenMP's thread pool does not survive a fork, and a child of a parent that
used it hangs at its first parallel region. Each child sets the thread count back.

Control lines on the worker's stdout (``CONTROL_PREFIX`` + JSON): ``ready`` (with the
import and load times), ``started`` (the cell's pid), ``exited`` (its exit code, negative
for a signal), ``error`` (the weights would not load: the runner falls back to a fresh
process per cell, which then stores the error as the cell's failure). Everything else is
a cell's output, routed like a fresh process's (``cell_process.route_line``).

``WarmPool`` (the local backend's): one worker at a time, for the model of the cell at
hand (cells run model by model), started when the first such cell comes -- after the
runner set the cells' OpenMP wait policy, which the worker's environment fixes.
``KVMAP_BENCH_WARM=0`` turns it off (a fresh process per cell, as before).
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from kvmap.bench.cell_process import (_child_setup, _die_with_parent, child_env,
                                      collect_result, route_line, write_cell_file)
from kvmap.bench.cellspec import CellSpec

CONTROL_PREFIX = "@@kvmap-warm"
WARM_ENV = "KVMAP_BENCH_WARM"
READY_TIMEOUT_S = 600.0        # imports and a first conversion of the weights
STARTED_TIMEOUT_S = 60.0


class WarmWorkerError(RuntimeError):
    """The worker did not start, or died."""


def warm_enabled() -> bool:
    return os.environ.get(WARM_ENV, "1") != "0"


def model_key(cell: CellSpec) -> tuple[str | None, str, str] | None:
    """What a worker holds for ``cell``: (model, dtype, device) as its engine loads them;
    None for a cell a worker does not run (an endpoint's)."""
    if cell.endpoint is not None:
        return None
    args = cell.engine_args().resolved()
    return (args.model, args.dtype, args.device)


class WarmWorker:
    """One worker process for one model key (module docstring)."""

    def __init__(self, key: tuple, python: str = sys.executable):
        self.key = key
        self.events: queue.Queue = queue.Queue()
        self.sink: tuple | None = None                  # (log file, on_fraction)
        self.startup: list[str] = []                     # output before the first cell
        self.proc = subprocess.Popen(
            [python, "-m", "kvmap.bench.warm_worker", json.dumps(list(key))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=child_env(), start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self._next_event(READY_TIMEOUT_S)
        if ready.get("event") != "ready":
            self.close()
            raise WarmWorkerError(f"warm worker for {key[0] or 'smollm2'} did not start: "
                                  f"{ready.get('error') or ''.join(self.startup[-15:])}")
        self.import_s, self.load_s = ready.get("import_s"), ready.get("load_s")

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(CONTROL_PREFIX):
                try:
                    self.events.put(json.loads(line[len(CONTROL_PREFIX):]))
                except ValueError:
                    pass
            elif self.sink is not None:
                route_line(line, *self.sink)
            else:
                self.startup.append(line)
        self.events.put({"event": "eof"})

    def _next_event(self, timeout_s: float) -> dict:
        try:
            return self.events.get(timeout=timeout_s)
        except queue.Empty:
            return {"event": "timeout"}

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, cell: CellSpec, work_dir: Path, log_path: Path,
            on_fraction: Callable[[float], None]) -> tuple[dict, list[dict]]:
        """The cell in a fork of this worker; ``(record, rows)`` as ``run_cell_subprocess``
        gives them. ``WarmWorkerError`` when the worker itself is gone before the cell
        started (the caller runs the cell in a fresh process instead)."""
        paths = write_cell_file(cell, work_dir)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        pid, timed_out, returncode, why = None, False, None, None
        with open(log_path, "w") as log:
            self.sink = (log, on_fraction)
            try:
                self.proc.stdin.write(json.dumps(
                    {"cell": str(paths[0]), "result": str(paths[1]),
                     "memory_limit_bytes": cell.memory_limit_bytes}) + "\n")
                self.proc.stdin.flush()
                started = self._next_event(STARTED_TIMEOUT_S)
                if started.get("event") != "started":
                    raise WarmWorkerError(f"warm worker gave {started} instead of a cell")
                pid = started["pid"]
                deadline = None if cell.timeout_s is None else t0 + cell.timeout_s
                killed_at = None
                while True:
                    now = time.perf_counter()
                    if killed_at is None and deadline is not None and now >= deadline:
                        _kill_group(pid)
                        timed_out, killed_at = True, now
                    event = self._next_event(0.5)
                    if event.get("event") == "exited":
                        returncode = event["returncode"]
                        break
                    if event.get("event") == "eof":
                        why = "the warm worker running the cell died"
                        break
                    if killed_at is not None and now - killed_at > 30:
                        why = "the cell did not end after it was killed"
                        break
            except (BrokenPipeError, OSError) as e:
                if pid is None:
                    raise WarmWorkerError(f"warm worker unreachable: {e}") from None
                why = f"warm worker unreachable: {e}"
            except BaseException:
                if pid is not None:
                    _kill_group(pid)
                    self._next_event(5.0)
                raise
            finally:
                if pid is not None:
                    _kill_group(pid)          # a grandchild the cell left behind
                self.sink = None
        return collect_result(cell, paths, log_path, returncode, timed_out,
                              time.perf_counter() - t0, why)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class WarmPool:
    """The local backend's workers: one at a time, for the model at hand. A model whose
    worker would not start is remembered, and its cells run in fresh processes."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self.worker: WarmWorker | None = None
        self.refused: dict[tuple, str] = {}
        self.started: list[dict] = []       # each worker's key, import and load times

    def worker_for(self, cell: CellSpec) -> WarmWorker | None:
        key = model_key(cell)
        if key is None or key in self.refused:
            return None
        if self.worker is not None and (self.worker.key != key or not self.worker.alive):
            self.worker.close()
            self.worker = None
        if self.worker is None:
            try:
                self.worker = WarmWorker(key, self.python)
            except WarmWorkerError as e:
                self.refused[key] = str(e)
                return None
            self.started.append({"model": key[0] or "smollm2", "dtype": key[1],
                                 "import_s": self.worker.import_s,
                                 "load_s": self.worker.load_s})
        return self.worker

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


# ---- the worker process -------------------------------------------------------------------

def _emit(event: dict) -> None:
    """A control line, in one write (a line under PIPE_BUF is never interleaved)."""
    os.write(1, f"{CONTROL_PREFIX} {json.dumps(event)}\n".encode())


def _child(request: dict, num_threads: int) -> None:
    """In the fork: become the cell's own process, run it, and exit without returning."""
    code = 1
    try:
        os.setsid()                   # the runner kills the cell's group, not the worker
        _child_setup(request.get("memory_limit_bytes"))()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        import torch
        torch.set_num_threads(num_threads)
        from kvmap.bench.cell import main
        code = main([request["cell"], request["result"]])
    except BaseException:  # noqa: BLE001 -- reported in the cell's log, then exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    model, dtype, device = json.loads(argv[0])
    t0 = time.perf_counter()
    import torch
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)             # no OpenMP pool before a fork (module docstring)
    import kvmap.bench.cell  # noqa: F401 -- what every cell imports, once
    import kvmap.bench.drive, kvmap.bench.probes, kvmap.bench.timeseries  # noqa: E401,F401
    import kvmap.bench.workload_metrics, kvmap.engine.llm, kvmap.evals  # noqa: E401,F401
    import kvmap.workloads  # noqa: F401
    t1 = time.perf_counter()
    try:
        from kvmap.model.loader import preload_model
        preload_model(model, dtype, device)
    except Exception as e:  # noqa: BLE001 -- the runner runs this model's cells cold
        _emit({"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 1
    sys.stdout.flush()
    _emit({"event": "ready", "import_s": round(t1 - t0, 3),
           "load_s": round(time.perf_counter() - t1, 3)})
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, num_threads)
        _emit({"event": "started", "pid": pid})
        _, status = os.waitpid(pid, 0)
        _emit({"event": "exited", "pid": pid, "returncode": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
