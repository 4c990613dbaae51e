"""The report's layer-kind table: a hybrid model's resident KV per layer kind, and the
hybrid saving measured against its all-global layout.

Every workload cell whose record splits its peak resident bytes by layer kind
(``peak_kv_resident_bytes_by_kind``: a model with sliding-window layers) gives a row:
the bytes of each kind and their total. A cell whose spec has the ``all_global`` window
layout (``kvmap.kv.window_layout``: sliding layers keep their whole history) is the
reference of the cell of the same model, workload, level and spec without that part
(``auto+all_global`` for ``auto``, which the bench names by its dtype, ``bf16``);
that cell's row carries the saving, the all-global
peak over the windowed one, with both numbers:

    4.05x (48.0 MiB windowed vs 194.6 MiB all-global)

A run without hybrid cells has no rows (and the report no table).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmap.config import format_bytes
from kvmap.kv import grammar
from kvmap.kv.codecs import CODECS
from kvmap.kv.config import AUTO_CODEC
from kvmap.kv.window_layout import WINDOW_LAYOUTS
from kvmap.runs.record import CellRecord

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class LayerKindRow:
    config: str                         # KV spec (with the model when several)
    workload: str                       # the workload, with its level when it has one
    bytes_by_kind: dict[str, int]       # peak resident bytes per layer kind
    all_global: bool                    # the spec keeps sliding layers whole
    reference_bytes: int | None = None  # the all-global cell's peak, on a windowed row

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_kind.values())

    @property
    def saving(self) -> float | None:
        """All-global peak / this windowed peak; None without a reference."""
        if self.reference_bytes is None or not self.total_bytes:
            return None
        return self.reference_bytes / self.total_bytes


def split_window_layout(spec: str, dtype: str | None = None) -> tuple[str, bool]:
    """``(the spec's key without its window-layout part, whether it had all_global)``.
    The key is the rest's parts in canonical form and sorted, with ``auto`` (or a
    missing codec) as the compute ``dtype``'s codec -- the bench names a bare ``auto``
    cell by its dtype -- so ``auto+all_global`` and ``bf16`` share the key ``bf16``."""
    try:
        parts = grammar.parse(spec)
    except ValueError:
        return spec, False
    whole = any(getattr(WINDOW_LAYOUTS[p.name], "keeps_whole_context", False)
                for p in parts if p.name in WINDOW_LAYOUTS)
    rest = [p for p in parts if p.name not in WINDOW_LAYOUTS]
    names = [dtype if p.name == AUTO_CODEC and dtype else str(p) for p in rest]
    if dtype and not any(p.name in CODECS or p.name == AUTO_CODEC for p in rest):
        names.append(dtype)
    return "+".join(sorted(names)), whole


def layer_kind_rows(cells: list[CellRecord]) -> list[LayerKindRow]:
    """Rows for every hybrid workload cell, in the cells' order (module docstring)."""
    found = []
    for c in cells:
        if c.status != "ok" or c.kind != "workload":
            continue
        kinds = c.workload_metrics.peak_kv_resident_bytes_by_kind
        if not kinds:
            continue
        base, whole = split_window_layout(c.kv, c.dtype)
        key = (c.model, c.quantization, c.workload, c.load_label, base)
        found.append((key, whole, c, {k: int(v) for k, v in kinds.items()}))
    references = {key: sum(kinds.values()) for key, whole, _, kinds in found if whole}
    several_models = len({key[0] for key, *_ in found}) > 1
    rows = []
    for key, whole, c, kinds in found:
        label = f"{c.quantization} weights + {c.kv}" if c.quantization else c.kv
        workload = c.workload if key[3] is None else f"{c.workload}@{key[3]}"
        rows.append(LayerKindRow(f"{c.model}: {label}" if several_models else label,
                                 workload or "-", kinds, whole,
                                 None if whole else references.get(key)))
    return rows


HEADERS = ("KV config", "workload", "peak KV by layer kind", "peak KV",
           "hybrid saving (all-global / windowed)")


def saving_text(row: LayerKindRow) -> str:
    if row.all_global:
        return "(the all-global reference)"
    if row.saving is None or row.reference_bytes is None:
        return "-"
    return (f"{row.saving:.2f}x ({format_bytes(row.total_bytes)} windowed vs "
            f"{format_bytes(row.reference_bytes)} all-global)")


def formatted(row: LayerKindRow) -> list[str]:
    """The row as the terminal and the HTML show it."""
    kinds = ", ".join(f"{kind} {format_bytes(b)}" for kind, b in row.bytes_by_kind.items())
    return [row.config, row.workload, kinds, format_bytes(row.total_bytes), saving_text(row)]


def layer_kind_table(cells: list[CellRecord]) -> Table | None:
    """A rich ``Table`` of ``layer_kind_rows``, or None when the run has no hybrid cell."""
    from rich.table import Table
    rows = layer_kind_rows(cells)
    if not rows:
        return None
    table = Table(title="hybrid models: resident KV by layer kind, saving against all-global",
                  title_justify="left", header_style="bold")
    for header in HEADERS:
        table.add_column(header, justify="right" if header == "peak KV" else "left")
    for row in rows:
        table.add_row(*formatted(row))
    return table
