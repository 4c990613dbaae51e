"""The report's fragmentation table: waste against block size, and what small blocks cost.

For every workload swept over block sizes (``kvmap.bench.block_sweep``: cells named
``<workload>@bs<size>``), one row per configuration, load level and block size, from the
cell records alone:

- ``kv_waste_bytes_max`` / ``kv_waste_bytes_mean``: allocated slots that hold no token,
  in bytes (``kvmap.kv.fragmentation``), the peak and the time mean over the cell;
- ``kv_waste_share_mean``: that waste as a share of resident KV, time mean;
- output throughput and P50 TBT, and each as a ratio to the *reference* block size of
  the same configuration and level: 16 (the usual default) when the sweep has it, else
  the sweep's first (smallest) size. A throughput ratio below 1 or a TBT ratio above 1
  is the time cost of that block size.

The block size is the record's ``kv_block_size`` (the pool's), else the name's suffix.
A run with no block-size sweep has no rows (and the report no table).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvmap.config import format_bytes
from kvmap.runs.names import base_name
from kvmap.runs.record import CellRecord
from kvmap.runs.workload_metrics import WorkloadMetrics

if TYPE_CHECKING:
    from rich.table import Table

REFERENCE_BLOCK_SIZE = 16


@dataclass(frozen=True)
class FragmentationRow:
    config: str                       # KV spec (with the model when several)
    workload: str                     # the swept workload's own name
    load: str | None                  # the load level's label, None for one level
    block_size: int
    waste_bytes_max: float | None
    waste_bytes_mean: float | None
    waste_share_mean: float | None
    throughput_tok_s: float | None
    tbt_p50_s: float | None
    reference_block_size: int
    throughput_ratio: float | None    # / the reference block size's
    tbt_p50_ratio: float | None


def _block_size(cell: CellRecord) -> int | None:
    size = cell.workload_metrics.kv_block_size
    if size is not None:
        return int(size)
    name = cell.workload or ""
    tail = name[len(base_name(name)) + len("@bs"):]
    return int(tail) if tail.isdigit() else None


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def fragmentation_rows(cells: list[CellRecord]) -> list[FragmentationRow]:
    """Rows for every block-size sweep of the run, in the cells' order (module docstring)."""
    groups: dict[tuple[Any, ...], dict[int, WorkloadMetrics]] = {}
    for c in cells:
        name = c.workload
        if c.status != "ok" or not name or base_name(name) == name \
                or c.endpoint is not None:    # a server's own block size
            continue
        size = _block_size(c)
        if size is None:
            continue
        key = (c.model, c.quantization, c.kv, base_name(name), c.load_label)
        groups.setdefault(key, {})[size] = c.workload_metrics
    several_models = len({k[0] for k in groups}) > 1
    rows = []
    for (model, quant, kv, workload, load), by_size in groups.items():
        sizes = sorted(by_size)
        ref = REFERENCE_BLOCK_SIZE if REFERENCE_BLOCK_SIZE in by_size else sizes[0]
        ref_tput = by_size[ref].output_tokens_per_s
        ref_tbt = by_size[ref].summary("tbt_s").p50
        label = f"{quant} weights + {kv}" if quant else kv
        for size in sizes:
            m = by_size[size]
            tput, tbt = m.output_tokens_per_s, m.summary("tbt_s").p50
            rows.append(FragmentationRow(
                f"{model}: {label}" if several_models else label, workload, load, size,
                m.kv_waste_bytes_max, m.kv_waste_bytes_mean,
                m.kv_waste_share_mean, tput, tbt, ref, _ratio(tput, ref_tput),
                _ratio(tbt, ref_tbt)))
    return rows


HEADERS = ("KV config", "workload", "block", "waste peak", "waste mean", "waste share",
           "tok/s", "tok/s vs ref", "P50 TBT ms", "TBT vs ref")


def formatted(row: FragmentationRow) -> list[str]:
    """The row as the terminal and the HTML show it (``-`` where not measured)."""
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else fmt.format(value)
    workload = row.workload if row.load is None else f"{row.workload}@{row.load}"
    return [row.config, workload,
            f"{row.block_size}" + (" (ref)" if row.block_size == row.reference_block_size
                                   else ""),
            "-" if row.waste_bytes_max is None else format_bytes(row.waste_bytes_max),
            "-" if row.waste_bytes_mean is None else format_bytes(row.waste_bytes_mean),
            num(row.waste_share_mean, "{:.1%}"), num(row.throughput_tok_s, "{:.1f}"),
            num(row.throughput_ratio, "{:.2f}x"),
            num(None if row.tbt_p50_s is None else row.tbt_p50_s * 1e3, "{:.1f}"),
            num(row.tbt_p50_ratio, "{:.2f}x")]


def fragmentation_table(cells: list[CellRecord]) -> Table | None:
    """A rich ``Table`` of ``fragmentation_rows``, or None when the run has no sweep."""
    from rich.table import Table
    rows = fragmentation_rows(cells)
    if not rows:
        return None
    table = Table(title="fragmentation: internal KV waste against block size",
                  title_justify="left", header_style="bold")
    for header in HEADERS:
        table.add_column(header, justify="left" if header in ("KV config", "workload")
                         else "right")
    for row in rows:
        table.add_row(*formatted(row))
    return table
