"""How a record names the workload of a block-size sweep: each block size is its own
workload entry, ``<workload>@bs<size>`` (``kvmap.bench.block_sweep`` makes them), which
the report's fragmentation table and deployments group back by ``base_name``."""
from __future__ import annotations

_SUFFIX = "@bs"


def sweep_name(name: str, block_size: int) -> str:
    return f"{name}{_SUFFIX}{block_size}"


def base_name(workload: str) -> str:
    """``frag@bs16`` -> ``frag``; a name without the suffix is its own base."""
    head, sep, tail = workload.rpartition(_SUFFIX)
    return head if sep and tail.isdigit() else workload
