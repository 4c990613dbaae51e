"""What a KV configuration does on each kind of layer of a hybrid model (sliding-window
layers beside global ones), said once for the engine, the planner and the report.

- A codec acts on every layer alike: the same bytes per token on both kinds.
- A selection policy acts on the global layers only. A sliding layer already holds at
  most its window, and within it a policy is a no-op: the engine keeps the sliding
  layers' most recent tokens (their window) whatever the policy scores, so no saving
  is counted there. A budget smaller than the window would cut the sliding layers to
  the budget; that is said too.
- Sliding layers release what slides out of the window only with per-layer block tables
  (``kvmap.kv.layer_pool``); a codec with per-layer state or tiers keep them whole,
  masked.

These are warnings, not failures: the configuration runs, and the notes name the
layers each part leaves alone.
"""
from __future__ import annotations

import warnings

from kvmap.kv.layer_pool import per_layer_tables_blocker
from kvmap.kv.spec import KVGeometry


def layer_ranges(layers) -> str:
    """``[0, 1, 2, 4, 6, 7]`` -> ``"0-2, 4, 6-7"``."""
    layers, out = sorted(layers), []
    i = 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ", ".join(out)


def layer_kind_notes(geom: KVGeometry, policy, per_layer_tables: bool,
                     blocker: str | None = None) -> list[str]:
    """Sentences on what the configuration does per layer kind; [] for a model whose
    layers are all global."""
    sliding = geom.sliding_layers
    if not sliding:
        return []
    windows = sorted({geom.windows[i] for i in sliding})
    window = "/".join(str(w) for w in windows)
    notes = []
    if not per_layer_tables:
        notes.append(f"sliding layers {layer_ranges(sliding)} keep their whole context "
                     f"resident (masked to the {window}-token window): {blocker or 'shared block table'}")
    if policy is not None:
        notes.append(f"{policy!r} acts on the global layers {layer_ranges(geom.global_layers)} "
                     f"only; it leaves the sliding layers {layer_ranges(sliding)} alone "
                     f"(each keeps its last {window} tokens: a no-op inside the window, no "
                     f"saving counted); a budget under the window cuts them to the budget")
    return notes


def warn_layer_kinds(geom: KVGeometry, kv_config, per_layer_tables: bool, codec,
                     compute_dtype, has_tiers: bool) -> list[str]:
    """Warn (``UserWarning``) with ``layer_kind_notes``; returns them."""
    blocker = per_layer_tables_blocker(codec, geom, compute_dtype, has_tiers)
    notes = layer_kind_notes(geom, kv_config.policy, per_layer_tables, blocker)
    for note in notes:
        warnings.warn(f"KV spec {kv_config.spec!r}: {note}", stacklevel=3)
    return notes
