"""System time series of a workload cell: a ~10 Hz sampler thread and its Parquet file.

``TimeSeriesSampler(engine)`` wraps the drive loop; each sample is one row of
``snapshot(engine)`` (the only function that reads engine internals) plus process CPU
and RSS (psutil), the process's disk IO (``/proc/self/io``) and, where NVML loads
(``pip install kvmap[gpu]``), GPU utilisation and memory. Reading the engine from another
thread is racy by design: every read is a length or a counter, and a torn sample only
blurs one point of the series. ``summary()`` gives the record keys (waste, see
``kvmap.kv.fragmentation``); ``write_timeseries`` moves the series from a record's
``metrics`` to ``<run>/timeseries/<cell>.parquet``.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from kvmap.engine.stats import kv_waste
from kvmap.hardware.process import proc_io

PERIOD_S = 0.1


def snapshot(engine) -> dict:
    """The engine's state now, flat: queues, KV bytes per tier, tier IO, waste."""
    kv, sched = engine.kv, engine.scheduler
    running = list(sched.running)
    waste = kv_waste(engine)
    out = {"num_running": len(running), "num_waiting": len(sched.waiting),
           "kv_resident_bytes_device": kv.resident_block_bytes(),
           "kv_waste_bytes": waste.waste_bytes, "kv_waste_share": waste.share}
    offload = engine.offload
    for level in (offload.levels if offload is not None else []):
        name, stats = level.tier.name, level.tier.stats
        out[f"kv_resident_bytes_{name}"] = level.tier.used_bytes
        out[f"tier_{name}_bytes_read"] = stats.bytes_read
        out[f"tier_{name}_bytes_written"] = stats.bytes_written
        out[f"tier_{name}_read_s"] = stats.read_s
        out[f"tier_{name}_write_s"] = stats.write_s
    return out


class _Gpu:
    """NVML device 0, or nothing (no extra installed, no driver)."""

    def __init__(self) -> None:
        self.handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 -- absent or broken NVML: GPU columns skipped
            self.handle = None

    def read(self) -> dict:
        if self.handle is None:
            return {}
        util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        mem = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return {"gpu_util_pct": float(util.gpu), "gpu_memory_used_bytes": int(mem.used)}


class TimeSeriesSampler:
    """``with TimeSeriesSampler(engine) as ts:`` samples every ``period_s`` in a daemon
    thread until the block ends; ``ts.rows`` is the series (``t_s`` from the start)."""

    def __init__(self, engine, period_s: float = PERIOD_S, read=snapshot):
        import psutil
        self.engine, self.period_s, self.read = engine, period_s, read
        self.proc = psutil.Process()
        self.gpu = _Gpu()
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kvmap-ts")

    def sample(self) -> None:
        times = self.proc.cpu_times()
        row = {"t_s": time.perf_counter() - self.t0,
               "cpu_s": times.user + times.system,
               "rss_bytes": self.proc.memory_info().rss,
               **proc_io(), **self.gpu.read(), **self.read(self.engine)}
        self.rows.append(row)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> TimeSeriesSampler:
        self.t0 = time.perf_counter()
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def columns(self) -> dict:
        """The series as columns (a column missing from some rows is None there)."""
        names = list(dict.fromkeys(k for row in self.rows for k in row))
        return {k: [row.get(k) for row in self.rows] for k in names}

    def summary(self) -> dict:
        """Record keys: waste max and time-weighted mean, over the cell."""
        t = [r["t_s"] for r in self.rows]
        out = {"kv_waste_bytes_max": max((r["kv_waste_bytes"] for r in self.rows), default=0)}
        for key, name in (("kv_waste_bytes", "kv_waste_bytes_mean"),
                          ("kv_waste_share", "kv_waste_share_mean")):
            out[name] = time_weighted_mean(t, [r[key] for r in self.rows])
        return out


def time_weighted_mean(t_s: list[float], values: list[float]) -> float | None:
    """Mean of a step function that holds ``values[i]`` from ``t_s[i]`` to ``t_s[i+1]``."""
    if not values:
        return None
    span = t_s[-1] - t_s[0]
    if span <= 0:
        return float(values[-1])
    return sum(v * (b - a) for v, a, b in zip(values, t_s, t_s[1:])) / span


def write_timeseries(run_dir: str | Path, record) -> Path | None:
    """Move ``record.metrics["timeseries"]`` (columns; ``record`` a ``CellRecord``) to
    ``<run_dir>/timeseries/<cell_id>.parquet``; None when the record has no series."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    columns = record.metrics.pop("timeseries", None)
    if not columns:
        return None
    path = Path(run_dir) / "timeseries" / f"{record.cell_id}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.table(columns), tmp)
    os.replace(tmp, path)
    return path
