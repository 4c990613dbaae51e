"""A tier's transfer per block on this machine (:func:`measure_tier_block`): one pool block
of every layer serialized (``kvmap.kv.tiers.serde``) and put into the tier, then got back
and decoded, as the engine's tiered store moves blocks. The fastest of a few rounds is
kept: on a shared machine a round the scheduler preempted says nothing of the transfer.
"""
from __future__ import annotations

import time

import torch

from kvmap.kv.config import KVConfig
from kvmap.kv.spec import KVGeometry

BLOCK_SIZE = 16


def _time(fn, calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls in a row."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def measure_tier_block(backend: str, spec: str, num_layers: int, num_kv_heads: int,
                       head_dim: int, dtype: torch.dtype, repeats: int = 5) -> dict:
    """Seconds to move one pool block (all ``num_layers`` layers) of codec ``spec`` down
    into tier ``backend`` (``write_s``: encode + put) and back (``read_s``: get +
    decode), and the block's bytes as stored (``block_bytes``)."""
    import tempfile

    from kvmap.kv.tiers.disk import DiskTier
    from kvmap.kv.tiers.host import HostTier
    from kvmap.kv.tiers.serde import decode_block, encode_block
    codec = KVConfig.parse(spec).codec
    store = codec.allocate(2, KVGeometry(1, num_kv_heads, head_dim, BLOCK_SIZE), "cpu", dtype,
                           layer_id=0)
    block = [store.block_to_bytes(0)] * num_layers
    with tempfile.TemporaryDirectory() as folder:
        tiers = {"host": lambda: HostTier(2**30),
                 "disk": lambda: DiskTier(2**30, directory=folder)}
        if backend not in tiers:
            raise ValueError(f"tier {backend!r}: the probe measures {', '.join(tiers)}")
        tier = tiers[backend]()
        data = encode_block(block)
        keys = (f"b{i}" for i in range(10**6))

        def write() -> None:
            tier.put(next(keys), encode_block(block))

        def read() -> None:
            decode_block(tier.get("b"))
        tier.put("b", data)
        samples = {"write_s": [], "read_s": []}
        for _ in range(repeats):
            samples["write_s"].append(_time(write, 4))
            samples["read_s"].append(_time(read, 4))
        tier.close()
    return {"block_bytes": len(data), **{k: min(v) for k, v in samples.items()}}
