"""Host-RAM tier: blocks kept as ``bytes`` in a dict.

The bytes are ordinary pageable memory. On CUDA the tiered store copies a block into a
pinned staging tensor before the host-to-device transfer; pinning belongs there, where
the device is known, not in a tier that only knows bytes.
"""
from __future__ import annotations

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

    def _read(self, key: Key) -> bytes | None:
        return self._data.get(key)

    def _write(self, key: Key, data: bytes) -> None:
        self._data[key] = data

    def _delete(self, key: Key) -> None:
        self._data.pop(key, None)

    def close(self) -> None:
        self._data.clear()
