"""What crosses the offloading doorway (``offloader.py``) back to the engine: typed values,
never a reference into the tiers that the engine would then reach through.

- :class:`PageOut`: pages of one request that went to the tiers. The offloading side
  wrote their frames and changed neither the request nor the pool; the engine's
  scheduler applies it (``Scheduler.apply_page_out``): frees the blocks, shortens the
  block table, marks the request ``evicted``.
- :class:`OffloadStep`: what attention needs from the tiers in one forward pass, asked
  for once per step by the runner (``AttentionMetadata.offload``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch


class OffloadedKV(Protocol):
    """The paged-out front of one sequence in one forward pass (``pager.OffloadedContext``)."""

    page_tokens: int

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def observe(self, layer: int, mass: torch.Tensor) -> None: ...


class LayerWait(Protocol):
    """Prefix blocks being copied into the pool layer by layer (``layer_loader.LayerLoader``)."""

    def wait(self, layer: int) -> None: ...


@dataclass(frozen=True)
class PageOut:
    """Whole pages of request ``request_id`` whose frames are now in the top tier level."""

    request_id: str
    block_ids: tuple[int, ...]   # the pool blocks they held, oldest first (page by page)
    num_tokens: int              # the KV slots they held: len(block_ids) * block_size

    def __post_init__(self) -> None:
        if not self.block_ids or self.num_tokens <= 0:
            raise ValueError(f"a page-out of request {self.request_id!r} moves at least one "
                             f"block (block_ids={self.block_ids}, num_tokens={self.num_tokens})")


@dataclass(frozen=True)
class OffloadStep:
    """The tiers' part of one forward pass: per decode row and per prefill segment of
    the batch (their indices in ``AttentionMetadata``), the paged-out front of a paged
    sequence; and the layer-wise prefix loads attention waits on. Empty (the default):
    nothing of this step is offloaded."""

    decode: Mapping[int, OffloadedKV] = field(default_factory=dict)
    prefill: Mapping[int, OffloadedKV] = field(default_factory=dict)
    loads: LayerWait | None = None

    def wait(self, layer: int) -> None:
        """Before layer ``layer`` reads or writes its store: its prefix blocks are in."""
        if self.loads is not None:
            self.loads.wait(layer)
