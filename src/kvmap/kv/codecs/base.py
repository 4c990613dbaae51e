"""The codec interface: how K and V of one layer are stored in paged blocks.

Storage of one layer is a :class:`LayerStore`: a dict of tensors whose first dimension
indexes blocks (data, scales, zero points ...), plus free-form codec state (an EMA
scale, for instance). Everything generic -- copying blocks, serializing a block for a
lower tier, counting resident bytes -- works on that dict without knowing the codec.

Token addressing (see ``kvmap.kv.pool``): slot = block_id * block_size + offset.

    k_cache["k"]: (num_blocks, block_size, num_kv_heads, head_dim)
                   ^ block_id   ^ offset

A codec subclass overrides ``allocate``, ``write`` and ``read``; the base class does
the plumbing (options, byte accounting). A quantizing codec may also offer
``read_scaled``: the codes of the blocks plus the affine map that decodes them
(:class:`ScaledRead`), so that attention can fold the scales into its scores and
probabilities instead of dequantizing (``kvmap.model.quant_attention``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from kvmap.kv.codecs.rows import HeadRows
from kvmap.kv.options import Options
from kvmap.kv.spec import KVGeometry, block_bytes_of
from kvmap.registry import Registry


def gather_blocks(t: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``t.index_select(0, block_ids)`` for a contiguous (num_blocks, ...) tensor, through
    its (num_blocks, block_numel) view: on the CPU a gather of rows of a 2-D tensor is one
    contiguous copy per row, while the same gather of a 4-D tensor walks it element by
    element (docs/architecture.md, "A bf16 gather trap")."""
    if not t.is_contiguous() or t.dim() <= 2:
        return t.index_select(0, block_ids)
    return t.view(t.shape[0], -1).index_select(0, block_ids).view(-1, *t.shape[1:])


@dataclass
class LayerStore:
    """One layer's KV storage. ``blocks[name]`` has shape (num_blocks, ...)."""

    blocks: dict[str, torch.Tensor]
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return next(iter(self.blocks.values())).shape[0]

    def copy_blocks(self, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor) -> None:
        """Copy whole blocks (all tensors) from src to dst, in place."""
        for t in self.blocks.values():
            t[dst_block_ids] = t[src_block_ids]

    def block_bytes(self) -> int:
        return block_bytes_of(self.blocks)

    def staging_bytes(self, live_blocks: torch.Tensor | None = None) -> int:
        """Bytes of this layer's staging pool (KIVI's residual window, staging.py):
        ``state["staging"]``, tensors of one row per first index, ``["sid"] < 0`` marking
        free rows and ``["owner"]`` the block a row holds. All rows, or the rows that hold
        one of ``live_blocks`` ((num_blocks,) bool: the blocks sequences use; a freed
        block's row is recycled first, being the least recently written)."""
        pool = self.state.get("staging", {})
        total = sum(t.element_size() * t.numel() for t in pool.values())
        if live_blocks is None or not pool:
            return total
        held = (pool["sid"] >= 0) & live_blocks.index_select(0, pool["owner"].clamp(min=0))
        return total // pool["sid"].shape[0] * int(held.sum())

    def block_to_bytes(self, block_id: int) -> list[tuple[str, torch.Tensor]]:
        """The tensors of one block, by name (views, no copy)."""
        return [(name, t[block_id]) for name, t in self.blocks.items()]


@dataclass
class ScaledRead:
    """K or V of N blocks as codes ``y`` and an affine map per group of g channels:

        x[n, t, h, d] = y[n, t, h, d] * scale[n, t, h, d // g] + bias[n, t, h, d // g]

    y       (N, bs, H, D), a dtype whose values convert exactly to the compute dtype
            (int8, uint8, or the compute dtype itself)
    scale   (N|1, bs|1, Hp, G) float32, G = D / g groups, Hp = H or 1 (shared by heads);
            size 1 in the first two dims when the map is the same for every token
    bias    like scale, or None for zero
    """

    y: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    @property
    def per_token(self) -> bool:
        """Whether the map varies over tokens (else it is one map per head and group)."""
        return self.scale.shape[0] * self.scale.shape[1] > 1 or (
            self.bias is not None and self.bias.shape[0] * self.bias.shape[1] > 1)


class Codec(Options):
    """Base codec. ``name`` is the spec-string name; ``options`` its validated options.

    Contract:
    - ``allocate(num_blocks, geom, device, compute_dtype, layer_id)`` returns a zeroed
      LayerStore for layer ``layer_id``.
    - ``write(store, slot_ids, k, v)`` encodes k, v of shape (T, num_kv_heads, head_dim)
      into the given slots (LongTensor (T,)). Mutates ``store`` only.
    - ``read(store, block_ids)`` returns (k, v), each (N, block_size, num_kv_heads,
      head_dim) in ``compute_dtype`` for the N blocks asked for -- never the whole cache.
    """

    kind: ClassVar[str] = "codec"

    def validate_geometry(self, geom: KVGeometry) -> None:
        """Check that the options fit this model's geometry (e.g. group size | head_dim)."""

    # ---- storage -----------------------------------------------------------------
    def allocate(self, num_blocks: int, geom: KVGeometry, device: torch.device | str,
                 compute_dtype: torch.dtype, layer_id: int | None = None) -> LayerStore:
        """``layer_id`` lets a codec with per-layer state (static scales) pick its own."""
        raise NotImplementedError

    def write(self, store: LayerStore, slot_ids: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        raise NotImplementedError

    def read(self, store: LayerStore, block_ids: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def read_scaled(self, store: LayerStore, block_ids: torch.Tensor
                    ) -> tuple[ScaledRead, ScaledRead] | None:
        """(K, V) of ``block_ids`` as codes and scales, or None when this codec has no
        such form (unquantized, or scales that vary along tokens and channels at once);
        ``read`` is then the way in. Decoding a ScaledRead equals ``read`` up to
        rounding."""
        return None

    def read_rows(self, store: LayerStore, rows: HeadRows
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(K, V) of a decode batch heads first, each (H, B*L, D) in ``compute_dtype``,
        equal value for value to ``read`` of the same slots; None when this codec has
        no such form (``read`` is then the way in)."""
        return None

    def read_rows_scaled(self, store: LayerStore, rows: HeadRows
                         ) -> tuple[ScaledRead, ScaledRead] | None:
        """``read_scaled`` of a decode batch heads first: codes y (H, B*L, D) and their
        map (H, B*L, G) per slot or (Hp, 1, G) per layer; None when this codec has no
        such form."""
        return None

    # ---- accounting ----------------------------------------------------------------
    def block_bytes(self, geom: KVGeometry, compute_dtype: torch.dtype = torch.bfloat16) -> int:
        """Exact bytes of one block across all layers, from a one-block meta allocation."""
        store = self.allocate(1, geom, "meta", compute_dtype)
        return store.block_bytes() * geom.num_layers

    def bytes_per_token(self, geom: KVGeometry,
                        compute_dtype: torch.dtype = torch.bfloat16) -> float:
        """Bytes per token of the blocks (what sizes the pool); see ``resident_bytes``."""
        return self.block_bytes(geom, compute_dtype) / geom.block_size

    def staging_bytes(self, geom: KVGeometry, num_blocks: int,
                      compute_dtype: torch.dtype = torch.bfloat16) -> int:
        """Exact bytes outside the blocks of a cache of ``num_blocks``, all layers."""
        store = self.allocate(num_blocks, geom, "meta", compute_dtype)
        return store.staging_bytes() * geom.num_layers

    def num_blocks_in(self, kv_bytes: int, geom: KVGeometry,
                      compute_dtype: torch.dtype = torch.bfloat16) -> int:
        """Whole blocks a byte budget holds together with their staging pool (at most
        one row per block), 0 for none: the engine's pool and the planner both ask this."""
        per_block = self.block_bytes(geom, compute_dtype)
        n = max(0, kv_bytes) // per_block
        most = self.staging_bytes(geom, n, compute_dtype) if n else 0
        if not most:
            return n
        per_row = self.staging_bytes(geom, 1, compute_dtype)
        return max(0, (kv_bytes - most) // per_block, kv_bytes // (per_block + per_row))

    def staging_bytes_per_seq(self, geom: KVGeometry,
                              compute_dtype: torch.dtype = torch.bfloat16) -> int:
        """Staging bytes one running sequence needs, all layers (0 without staging)."""
        return 0

    def resident_bytes(self, geom: KVGeometry, context_tokens: int,
                       compute_dtype: torch.dtype = torch.bfloat16) -> int:
        """Exact bytes one sequence of ``context_tokens`` holds: its blocks plus its
        share of a staging pool."""
        num_blocks = -(-context_tokens // geom.block_size)
        return (num_blocks * self.block_bytes(geom, compute_dtype)
                + self.staging_bytes_per_seq(geom, compute_dtype))


# spec-string name -> codec class; each codec file registers its classes here
CODECS: Registry[type[Codec]] = Registry("codec")
