"""Shared plumbing for benchmark scripts: timing medians, the machine's matmul rate,
and the self-describing JSON record (schema version, git sha, the code that ran,
environment, config, metrics) written under benchmarks/results/."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch
from record_class import fields_from_profile

SCHEMA_VERSION = 1
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def median_time_s(fn, repeats: int = 3, warmup: int = 1) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def matmul_gflops(dtype: torch.dtype = torch.bfloat16, n: int = 2048, repeats: int = 5) -> float:
    """The machine's measured dense matrix-multiply rate (GFLOP/s) for ``dtype``."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    t, _ = median_time_s(lambda: a @ b, repeats)
    return 2 * n ** 3 / t / 1e9


def _git(cwd: Path, *args: str) -> str | None:
    """``git args`` in ``cwd``: its output without the trailing newline, or None."""
    try:
        return subprocess.check_output(["git", *args], text=True, cwd=cwd,
                                       stderr=subprocess.DEVNULL).rstrip("\n")
    except (OSError, subprocess.CalledProcessError):
        return None


def git_sha() -> str:
    return _git(Path(__file__).parent, "rev-parse", "HEAD") or "unknown"


def code_state() -> dict:
    """Which kvmap ran: the directory it was imported from (a worktree on PYTHONPATH is
    not this script's checkout), that checkout's commit, and the tracked files under its
    ``src/`` and ``benchmarks/`` with uncommitted changes. A record's figures are its
    commit's only when that list is empty."""
    import kvmap
    src = Path(kvmap.__file__).resolve().parent
    top = _git(src, "rev-parse", "--show-toplevel")
    changed = None
    if top:
        status = _git(Path(top), "status", "--porcelain", "--untracked-files=no", "--",
                      "src", "benchmarks")
        changed = [line[3:] for line in (status or "").splitlines()]
    return {"kvmap_path": str(src), "git_sha": _git(src, "rev-parse", "HEAD"),
            "uncommitted": changed}


def environment() -> dict:
    """The machine: versions, threads, load, and its hardware profile (class, ISA,
    native bf16, the dtype ``auto`` picks, measured rates; ``kvmap hw``)."""
    from kvmap.hardware import record_summary
    return {
        "hardware": record_summary(measure_if_missing=True),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


_AT_IMPORT: dict = {}     # the code when the script started (it imports this module first)


def write_record(name: str, config: dict, metrics: dict) -> Path:
    """The record of a run: its ``machine_class`` and ``dtype`` (the profile's class; the
    config's dtype, else ``auto``'s there); ``git_sha`` and ``code`` as they were when the
    script started; ``code_at_write`` too when a commit or an edit landed while it ran."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    start = _AT_IMPORT or {"git_sha": git_sha(), "code": code_state()}
    env = environment()
    record = {"schema_version": SCHEMA_VERSION, "benchmark": name,
              **fields_from_profile(env["hardware"], config), **start,
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "environment": env, "config": config, "metrics": metrics}
    now = code_state()
    if now != start["code"]:
        record["code_at_write"] = now
    path = RESULTS_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=2))
    return path


_AT_IMPORT.update(git_sha=git_sha(), code=code_state())
