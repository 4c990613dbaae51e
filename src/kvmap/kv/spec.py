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
    ``num_kv_heads x head_dim`` values."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVGeometry.{name}={value!r} must be a positive integer")

    @property
    def values_per_token(self) -> int:
        """K and V values of one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @classmethod
    def of(cls, model_config, block_size: int = 16) -> "KVGeometry":
        return cls(model_config.num_layers, model_config.num_kv_heads,
                   model_config.head_dim, block_size)


def block_bytes_of(block_tensors: dict[str, torch.Tensor]) -> int:
    """Bytes of one block of one layer, given that layer's storage tensors whose first
    dimension indexes blocks: sum of element_size * numel / num_blocks."""
    total = 0
    for t in block_tensors.values():
        total += t.element_size() * t[0].numel()
    return total
