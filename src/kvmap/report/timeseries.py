"""The report's system time series: per configuration, memory, queue and IO over time,
from ``<run>/timeseries/<cell>.parquet`` (``kvmap.bench.timeseries``). A run without
series (older runs, task-only runs) draws nothing."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from kvmap.runs.record import CellRecord
from kvmap.runs.store import RunStore
from kvmap.report.plots import color, encode

MIB = 1024 * 1024


def _rate(t: list[float], counter: list[Any]) -> list[float]:
    """Per-second rate of a cumulative counter between samples (MiB/s)."""
    out = [0.0]
    for i in range(1, len(t)):
        dt = t[i] - t[i - 1]
        a, b = counter[i - 1] or 0, counter[i] or 0
        out.append((b - a) / dt / MIB if dt > 0 else 0.0)
    return out


def cell_figure(columns: dict[str, list[Any]], title: str) -> str:
    """Three panels over time: memory (RSS, KV device, waste), queues, process disk IO."""
    t = columns["t_s"]
    fig = Figure(figsize=(11, 3))
    mem, queue, io = fig.subplots(1, 3)
    key: str
    for i, key in enumerate(k for k in ("rss_bytes", "kv_resident_bytes_device",
                                        "kv_waste_bytes", "gpu_memory_used_bytes")
                            if k in columns):
        mem.plot(t, [(v or 0) / MIB for v in columns[key]], color=color(i), label=key)
    mem.set(title=f"{title}: memory", xlabel="s", ylabel="MiB")
    for i, key in enumerate(k for k in ("num_running", "num_waiting") if k in columns):
        queue.step(t, columns[key], where="post", color=color(i), label=key)
    queue.set(title="sequences", xlabel="s")
    for i, key in enumerate(k for k in columns if k.startswith("disk_") or
                            (k.startswith("tier_") and k.endswith("_bytes_read"))):
        io.plot(t, _rate(t, columns[key]), color=color(i), label=key)
    io.set(title="IO", xlabel="s", ylabel="MiB/s")
    for ax in (mem, queue, io):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return encode(fig)


def timeseries_figures(run_dir: str | Path, cells: list[CellRecord]) -> list[tuple[str, str]]:
    """``(label, base64 PNG)`` for each workload cell that has a stored series."""
    store, out = RunStore(run_dir), []
    for cell in cells:
        if cell.kind != "workload" and not cell.workload:
            continue
        table = store.timeseries(cell.cell_id)
        if table is None or table.num_rows < 2:
            continue
        label = f"{cell.kv} | {cell.workload}"
        out.append((label, cell_figure(table.to_pydict(), label)))
    return out
