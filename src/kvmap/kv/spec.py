"""KV geometry and the exact bytes a codec needs per token and per block.

Bytes are counted from the tensors a codec really allocates (data, scales and zero
points), so ``bytes_per_block`` is what the pool holds resident, to the byte.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVGeometry:
    """Shape of the KV cache of one model: per layer, each token holds K and V of
    ``num_kv_heads x head_dim`` values. ``layer_windows``: per layer, the sliding window
    (tokens a query sees, itself included) or None for a global layer; None: every
    layer is global. A sliding layer holds only the blocks its next query can see
    (``layer_resident_blocks``)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16
    layer_windows: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVGeometry.{name}={value!r} must be a positive integer")
        if self.layer_windows is not None:
            if len(self.layer_windows) != self.num_layers:
                raise ValueError(f"KVGeometry.layer_windows has {len(self.layer_windows)} "
                                 f"entries for {self.num_layers} layers")
            bad = [w for w in self.layer_windows if w is not None and w < 1]
            if bad:
                raise ValueError(f"KVGeometry.layer_windows has window {bad[0]!r}; a "
                                 f"window is at least 1 token")

    @property
    def values_per_token(self) -> int:
        """K and V values of one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Every layer's window (None: global)."""
        return self.layer_windows or (None,) * self.num_layers

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.windows) if w is not None)

    @property
    def global_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.windows) if w is None)

    @classmethod
    def of(cls, model_config, block_size: int = 16) -> "KVGeometry":
        """The geometry of ``model_config``; its layer windows when it is hybrid
        (``sliding_layers``: Gemma 3). A window on every layer (Mistral v0.1) stays a
        planner cap (``kvmap.plan.capacity``), not an engine geometry."""
        windows = model_config.layer_windows if model_config.sliding_layers is not None \
            else None
        return cls(model_config.num_layers, model_config.num_kv_heads,
                   model_config.head_dim, block_size, windows)

    def layer_kinds(self) -> dict[str, dict]:
        """``{"global": {"layers": [...]}, "sliding": {"layers": [...], "window": W}}``
        for the kinds present (one sliding kind per window size, ``sliding_<W>`` when
        there are several)."""
        kinds: dict[str, dict] = {}
        if self.global_layers:
            kinds["global"] = {"layers": list(self.global_layers), "window": None}
        sizes = sorted({w for w in self.windows if w is not None})
        for w in sizes:
            name = "sliding" if len(sizes) == 1 else f"sliding_{w}"
            kinds[name] = {"layers": [i for i, x in enumerate(self.windows) if x == w],
                           "window": w}
        return kinds


def first_live_slot(num_slots: int, window: int | None) -> int:
    """The first slot a layer must still hold once ``num_slots`` are written: the next
    query (slot ``num_slots``) sees ``window`` slots, itself included, so slots before
    ``num_slots - window + 1`` are dead. 0 for a global layer (``window`` None)."""
    return 0 if window is None else max(0, num_slots - window + 1)


def layer_resident_blocks(num_slots: int, block_size: int, window: int | None) -> int:
    """Blocks one layer of a sequence of ``num_slots`` slots holds: all of its table for a
    global layer; for a sliding one, from the block of ``first_live_slot`` on -- at most
    ``ceil((window - 1) / block_size) + 1``. The engine, the planner and the simulator
    all count a hybrid sequence with this."""
    total = -(-num_slots // block_size)
    return total - first_live_slot(num_slots, window) // block_size


def sequence_layer_blocks(num_slots: int, geom: KVGeometry) -> int:
    """Layer blocks (one layer's block each) a sequence of ``num_slots`` slots holds,
    summed over ``geom``'s layers (``layer_resident_blocks``)."""
    return sum(layer_resident_blocks(num_slots, geom.block_size, w) for w in geom.windows)


def peak_layer_blocks(num_tokens: int, chunk_tokens: int, geom: KVGeometry) -> int:
    """Most layer blocks a sequence of ``num_tokens`` holds at once while it is
    prefilled in chunks of ``chunk_tokens``: a global layer its whole table, a sliding
    one its window behind the chunk plus the chunk (``window - 1 + chunk`` slots, one
    block more for the unaligned start), never more than the whole table."""
    bs = geom.block_size
    total = -(-num_tokens // bs)
    return sum(total if w is None else min(total, -(-(w - 1 + chunk_tokens) // bs) + 1)
               for w in geom.windows)


def block_bytes_of(block_tensors: dict[str, torch.Tensor]) -> int:
    """Bytes of one block of one layer, given that layer's storage tensors whose first
    dimension indexes blocks: sum of element_size * numel / num_blocks."""
    total = 0
    for t in block_tensors.values():
        total += t.element_size() * t[0].numel()
    return total
