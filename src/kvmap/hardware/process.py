"""This process and how busy the machine is around it: the load average, the process's
peak resident set and its storage IO, and the ``env`` a bench cell records (timings
from a shared, loaded machine are not comparable)."""
from __future__ import annotations

import os
import resource
import sys
from pathlib import Path


def load_avg() -> float | None:
    """The machine's 1-minute load average; None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def peak_rss_bytes() -> int:
    """Peak resident set of this process (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def proc_io() -> dict:
    """Bytes this process read and wrote through storage (Linux); {} elsewhere."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return {}
    fields = dict(line.split(": ") for line in text.splitlines() if ": " in line)
    return {"disk_read_bytes": int(fields.get("read_bytes", 0)),
            "disk_write_bytes": int(fields.get("write_bytes", 0))}


def machine_env(load_start: float | None) -> dict:
    """How busy the machine was over a cell that started at load ``load_start``: threads,
    load average at both ends, CPUs, the OpenMP wait policy, the hardware profile."""
    torch = sys.modules.get("torch")
    from kvmap.hardware.profile import record_summary
    return {"num_threads": torch.get_num_threads() if torch is not None else None,
            "load_avg_1m_start": load_start, "load_avg_1m_end": load_avg(),
            "num_cpus": os.cpu_count(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "hardware": record_summary()}
