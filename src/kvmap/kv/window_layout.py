"""The window-layout part of a KV spec: how a hybrid model's sliding-window layers are
held in memory.

    all_global

By default a sliding layer (Gemma 3: 15 of 18 layers, a 512-token window) holds only
the blocks its next query can still see: per-layer block tables give the rest back
(``kvmap.kv.layer_pool``). ``all_global`` keeps every layer's whole history resident,
as an all-global model (or an engine that knows no windows) would, while attention is
still masked to each layer's window -- so the outputs are those of the default layout
and only the memory differs. It is the reference the hybrid saving is measured against
on the same work (``auto`` vs ``auto+all_global``), the engine's counterpart of
``kvmap plan --all-global``. On a model whose layers are all global it changes nothing.
"""
from __future__ import annotations

from typing import ClassVar

from kvmap.kv.options import Options
from kvmap.registry import Registry

# spec-string name -> window-layout part
WINDOW_LAYOUTS: Registry[type] = Registry("window layout")


class WindowLayout(Options):
    """A window layout; ``keeps_whole_context``: sliding layers keep every block;
    ``reference_only``: measured beside the default as a reference, never recommended
    as a deployment choice (the report's recommender leaves it out)."""

    kind: ClassVar[str] = "window layout"
    keeps_whole_context: ClassVar[bool] = False
    reference_only: ClassVar[bool] = False

    def per_layer_tables_blocker(self) -> str | None:
        """Why this layout keeps the sliding layers off per-layer tables, or None."""
        if not self.keeps_whole_context:
            return None
        return (f"the {self.name} layout keeps every layer's whole context (the reference "
                f"of the hybrid saving)")


@WINDOW_LAYOUTS.register
class AllGlobal(WindowLayout):
    """Every sliding layer keeps its whole history, attention masked to its window."""

    name = "all_global"
    defaults = {}
    keeps_whole_context = True
    reference_only = True     # the same tokens for more memory: a baseline, not a choice
