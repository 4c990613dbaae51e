"""One cell in a child process: ``python -m kvmap.bench.cell``, its timeout, its log.

``run_cell_subprocess(cell, work_dir, log_path)`` is what every backend runs for a cell:
the local backend with the run directory's ``.work/`` and ``logs/``, a Ray task with a
temporary directory on its worker (so workers need no shared filesystem). It returns
``(record, rows)`` and never raises for a cell failure: an exception inside the cell, a
crash and a timeout all come back as a record with ``"status": "failed"`` and its error.
``KeyboardInterrupt`` (or any other exception in the caller's thread) kills the child and
propagates.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvmap.bench.cellspec import CellSpec
from kvmap.bench.record import PROGRESS_PREFIX, CellRecord


def failed_record(cell: CellSpec, error: str, duration_s: float) -> dict:
    """The record of a cell that produced none of its own (crash, timeout, lost worker)."""
    return CellRecord.of_cell(cell, status="failed", error=error,
                              duration_s=duration_s).to_dict()


def child_env() -> dict:
    """The cell process imports what this one does (``module:function`` tasks included).

    ``OMP_WAIT_POLICY=PASSIVE`` (unless set): OpenMP threads that spin at barriers are a
    disaster on a shared machine -- with one core busy elsewhere, a 2-thread torch ran a
    long-context cell 5-10x slower than 1 thread; passive waiting ran it as fast as 1
    thread there, and keeps both threads' worth on an idle machine."""
    env = dict(os.environ)
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
    import signal
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_cell_subprocess(cell: CellSpec, work_dir: Path, log_path: Path,
                        on_fraction: Callable[[float], None] = lambda f: None,
                        python: str = sys.executable) -> tuple[dict, list[dict]]:
    """Run one cell in a child process; ``(record, rows)`` (see the module docstring).

    ``work_dir`` holds the cell's input and result files while it runs; the child's
    output (progress lines excepted) goes to ``log_path``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    cell_path = work_dir / f"{cell.cell_id}.cell.json"
    result_path = work_dir / f"{cell.cell_id}.out.json"
    cell_path.write_text(json.dumps(cell.to_dict()))
    result_path.unlink(missing_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, "-m", "kvmap.bench.cell", str(cell_path),
                                 str(result_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=child_env(),
                                preexec_fn=_die_with_parent if sys.platform == "linux"
                                else None)

        def pump() -> None:               # progress lines -> callback, the rest -> log
            for line in proc.stdout:
                if line.startswith(PROGRESS_PREFIX):
                    try:
                        on_fraction(json.loads(line[len(PROGRESS_PREFIX):])["fraction"])
                    except (ValueError, KeyError):
                        pass
                else:
                    log.write(line)
                    log.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            while proc.poll() is None:
                if cell.timeout_s is not None and time.perf_counter() - t0 > cell.timeout_s:
                    proc.kill()
                    timed_out = True
                    break
                time.sleep(0.1)
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        reader.join(timeout=5)
    duration_s = time.perf_counter() - t0
    cell_path.unlink(missing_ok=True)
    if timed_out:
        result_path.unlink(missing_ok=True)
        return failed_record(cell, f"timed out after {cell.timeout_s:g} s (cell_timeout_s)",
                             duration_s), []
    if proc.returncode == 0 and result_path.is_file():
        result = json.loads(result_path.read_text())
        result_path.unlink()
        return result["record"], result["rows"]
    tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:]).strip()
    return failed_record(cell, f"cell process exited with code {proc.returncode}"
                               f"{': ' + tail if tail else ''}", duration_s), []
