"""One cell in a child process: ``python -m kvmap.bench.cell``, its timeout, its log.

``run_cell_subprocess(cell, work_dir, log_path)`` is what every backend runs for a cell:
the local backend with the run directory's ``.work/`` and ``logs/``, a Ray task with a
temporary directory on its worker (so workers need no shared filesystem). It returns
``(record, rows)`` and never raises for a cell failure: an exception inside the cell, a
crash and a timeout all come back as a record with ``"status": "failed"`` and its error.
``KeyboardInterrupt`` (or any other exception in the caller's thread) kills the child and
propagates.

Limits: the child runs in a session of its own, so a timeout or an interrupt kills its
whole process group (its own children too); its OOM score is raised (the kernel picks it,
not the runner); ``cell.memory_limit_bytes`` caps its address space (``RLIMIT_AS``; a cell
over it fails with a MemoryError in its record). Its log lines are redacted.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvmap.bench.cellspec import CellSpec
from kvmap.bench.log_pump import pump_lines
from kvmap.kv.redact import redact_spec
from kvmap.runs.record import CellRecord

OOM_SCORE_ADJ = 1000   # the most likely victim of the OOM killer: the cell, not the runner
PROGRESS_PREFIX = "@@kvmap-progress"   # a child's progress line: PREFIX {"fraction": f}


def failed_record(cell: CellSpec, error: str, duration_s: float) -> CellRecord:
    """The record of a cell that produced none of its own (crash, timeout, lost worker)."""
    return CellRecord.of_cell(cell, status="failed", error=error, duration_s=duration_s)


CELL_WAIT_POLICY_ENV = "KVMAP_CELL_OMP_WAIT_POLICY"


def child_env() -> dict:
    """The cell process imports what this one does (``module:function`` tasks included).

    OpenMP's wait policy: what the runner measured at the start of the run
    (``kvmap.hardware.threads``; it sets ``KVMAP_CELL_OMP_WAIT_POLICY`` while the run
    lasts: ``default`` leaves ``OMP_WAIT_POLICY`` unset, spinning), else
    ``OMP_WAIT_POLICY=PASSIVE`` unless set: threads that spin at barriers are a disaster
    on a shared machine (a 2-thread torch ran a long-context cell 5-10x slower with one
    core busy elsewhere), while on a quiet machine spinning is 1.7x faster."""
    env = dict(os.environ)
    chosen = env.pop(CELL_WAIT_POLICY_ENV, None)
    if chosen == "default":
        env.pop("OMP_WAIT_POLICY", None)
    elif chosen:
        env["OMP_WAIT_POLICY"] = chosen
    else:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _die_with_parent() -> None:
    """In the child, before exec (Linux): be killed when the process that started us
    dies -- a Ray worker killed at shutdown must not leave its cell running."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_setup(memory_limit_bytes: int | None):
    """What the child does before exec: die with its parent, raise its OOM score, cap its
    address space. Runs between fork and exec: no locks, no imports beyond these."""
    def setup() -> None:
        _die_with_parent()
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(OOM_SCORE_ADJ))
        except OSError:
            pass
        if memory_limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    return setup


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (the child leads it: ``start_new_session``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def sweep_after_kill(kv_spec: str) -> None:
    """After a cell was killed (it ran no clean-up): remove the tier storage of dead
    processes that its spec's levels point at (each backend's ``sweep``: disk
    directories, private Redis namespaces). Best effort, never raises."""
    try:
        from kvmap.kv.config import KVConfig
        from kvmap.kv.tiers import TIER_BACKENDS
        layout = KVConfig.parse(kv_spec).tiers
        for level in layout.levels if layout is not None else ():
            try:
                TIER_BACKENDS[level.name].sweep_after_kill(level.backend_options)
            except Exception:  # noqa: BLE001 -- one level's clean-up must not stop the next
                pass
    except Exception:  # noqa: BLE001 -- clean-up must not turn a failed cell into a crash
        pass


def write_cell_file(cell: CellSpec, work_dir: Path) -> tuple[Path, Path]:
    """The cell's spec as JSON in ``work_dir`` (readable by us alone: a Redis URL may carry
    a password) and the path its result will have: ``(cell_path, result_path)``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    cell_path = work_dir / f"{cell.cell_id}.cell.json"
    result_path = work_dir / f"{cell.cell_id}.out.json"
    fd = os.open(cell_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(cell.to_dict()))
    result_path.unlink(missing_ok=True)
    return cell_path, result_path


def route_line(line: str, log, on_fraction: Callable[[float], None]) -> bool:
    """One line of a cell's output: a progress line to ``on_fraction`` (True), the rest to
    ``log``, redacted (None: left to the caller, ``log_pump``; False)."""
    if line.startswith(PROGRESS_PREFIX):
        try:
            on_fraction(json.loads(line[len(PROGRESS_PREFIX):])["fraction"])
        except (ValueError, KeyError):
            pass
        return True
    if log is not None:
        log.write(redact_spec(line))
        log.flush()
    return False


def collect_result(cell: CellSpec, paths: tuple[Path, Path], log_path: Path,
                   returncode: int | None, timed_out: bool, duration_s: float,
                   why: str | None = None) -> tuple[CellRecord, list[dict]]:
    """``(record, rows)`` of a cell process that ended with ``returncode`` (or was killed
    at its timeout): its result file, else a failed record with the tail of its log
    (``why`` says what ended it when it is not an exit code)."""
    cell_path, result_path = paths
    cell_path.unlink(missing_ok=True)
    if timed_out or returncode != 0:
        sweep_after_kill(cell.kv)
    if timed_out:
        result_path.unlink(missing_ok=True)
        return failed_record(cell, f"timed out after {cell.timeout_s:g} s (cell_timeout_s)",
                             duration_s), []
    if returncode == 0 and result_path.is_file():
        result = json.loads(result_path.read_text())
        result_path.unlink()
        return CellRecord.from_dict(result["record"]), result["rows"]
    tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:]).strip() \
        if log_path.is_file() else ""
    return failed_record(cell, f"{why or f'cell process exited with code {returncode}'}"
                               f"{': ' + tail if tail else ''}", duration_s), []


def run_cell_subprocess(cell: CellSpec, work_dir: Path, log_path: Path,
                        on_fraction: Callable[[float], None] = lambda f: None,
                        python: str = sys.executable) -> tuple[CellRecord, list[dict]]:
    """Run one cell in a child process; ``(record, rows)`` (see the module docstring).

    ``work_dir`` holds the cell's input and result files while it runs; the child's
    output (progress lines excepted) goes to ``log_path``."""
    paths = write_cell_file(cell, work_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, "-m", "kvmap.bench.cell", str(paths[0]),
                                 str(paths[1])], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=child_env(),
                                start_new_session=True,
                                preexec_fn=_child_setup(getattr(cell, "memory_limit_bytes",
                                                                None))
                                if sys.platform == "linux" else None)

        def progress(line: str) -> bool:  # progress lines -> callback, the rest -> log
            return route_line(line, None, on_fraction)

        reader = pump_lines(proc.stdout, log, progress)
        timed_out = False
        try:
            while proc.poll() is None:
                if cell.timeout_s is not None and time.perf_counter() - t0 > cell.timeout_s:
                    _kill_group(proc)
                    timed_out = True
                    break
                time.sleep(0.1)
            proc.wait()
            _kill_group(proc)             # a grandchild the cell left behind
        except BaseException:
            _kill_group(proc)
            proc.wait()
            raise
        reader.join(timeout=5)
    return collect_result(cell, paths, log_path, proc.returncode, timed_out,
                          time.perf_counter() - t0)
