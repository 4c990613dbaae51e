"""Host-RAM tier: blocks kept as ``bytes`` in a dict.

The bytes are ordinary pageable memory. A host-to-device transfer goes through
:meth:`HostTier.upload`: the block's bytes are copied into one staging tensor, pinned
(page-locked) when the target is a CUDA device so that the copy to the device is a DMA
that can overlap compute, and plain pageable memory on the CPU (where pinning buys
nothing and needs a CUDA build). The tier learns the device only from the call.
"""
from __future__ import annotations

import numpy as np
import torch

from kvmap.kv.tiers.backend import tier_backend
from kvmap.kv.tiers.base import Key, Tier


@tier_backend(order=10, latency_prior_s=20e-6, bandwidth_prior_bytes_per_s=2e9)
class HostTier(Tier):
    """A dict of bytes bounded by ``capacity_bytes``. No CRC on reads: nothing between
    ``put`` and ``get`` can corrupt process memory that the tier alone holds."""

    name = "host"

    def __init__(self, capacity_bytes: int, eviction="lru", on_evict=None) -> None:
        super().__init__(capacity_bytes, eviction, on_evict)
        self._data: dict[Key, bytes] = {}
        self._staging: torch.Tensor | None = None     # grown on demand, reused
        self._in_flight = None       # CUDA event of the last asynchronous upload

    def staging(self, num_bytes: int, device: torch.device | str) -> torch.Tensor:
        """A uint8 staging view of ``num_bytes``, pinned when ``device`` is CUDA. The
        same buffer is handed out again (grown when too small): valid until the next
        call."""
        pin = torch.device(device).type == "cuda"
        if self._in_flight is not None:     # the last upload may still read the buffer
            self._in_flight.synchronize()
            self._in_flight = None
        buf = self._staging
        if buf is None or buf.numel() < num_bytes or buf.is_pinned() != pin:
            buf = self._staging = torch.empty(max(num_bytes, 1), dtype=torch.uint8,
                                              pin_memory=pin)
        return buf[:num_bytes]

    def upload(self, data: bytes, device: torch.device | str) -> torch.Tensor:
        """``data`` as a uint8 tensor on ``device``, through the staging buffer (an
        asynchronous copy from pinned memory on CUDA; a copy of its own on the CPU)."""
        stage = self.staging(len(data), device)
        stage.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
        if torch.device(device).type != "cuda":
            return stage.clone()
        out = stage.to(device, non_blocking=True)
        self._in_flight = torch.cuda.Event()
        self._in_flight.record()
        return out

    def _read(self, key: Key) -> bytes | None:
        return self._data.get(key)

    def _write(self, key: Key, data: bytes) -> None:
        self._data[key] = data

    def _delete(self, key: Key) -> None:
        self._data.pop(key, None)

    def close(self) -> None:
        self._data.clear()
