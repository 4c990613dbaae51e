"""A workload swept over KV block sizes: ``block_size: [8, 16, 32, 64]`` in a workload.

Each block size is its own workload entry, named ``<workload>@bs<size>`` (so every other
table of the report keeps one figure per workload and configuration), run on the
scenario's engine with that block size; a load sweep inside it multiplies as usual::

    workloads:
      - {name: frag, num_requests: 16, prompt_len: uniform:40-200, block_size: [8, 16, 32]}
    -> cells  frag@bs8, frag@bs16, frag@bs32   (per KV configuration)

The report's fragmentation table (``kvmap.report.fragmentation``) groups them back by
``base_name`` (``kvmap.runs.names``) and the record's ``kv_block_size``. A bare integer is one block size (the
entry keeps its name). Bad input, reported with every other problem before any cell
runs: a non-positive, non-integer or non-increasing list (here), a block size that does
not divide a model's context or leaves the pool without one block (``check_block_size``).
"""
from __future__ import annotations

from typing import Any

BLOCK_SIZE_KEY = "block_size"


def parse_block_sizes(raw: Any, where: str, problems) -> list[int] | None:
    """The block sizes of a workload entry (None: not given, or not valid -- then the
    problem is recorded under ``<where>.block_size``)."""
    if raw is None:
        return None
    sizes = raw if isinstance(raw, list) else [raw]
    key = f"{where}.{BLOCK_SIZE_KEY}"
    bad = [s for s in sizes if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if not sizes or bad:
        problems.add(key, f"{raw!r} must be a positive integer or a non-empty list of "
                          f"them (bad: {bad[0]!r})" if bad else f"{raw!r} is empty")
        return None
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        problems.add(key, f"{raw!r} must be strictly increasing (each block size once)")
        return None
    return sizes


def check_block_size(block_size: int, context_tokens: int, pool_tokens: int,
                     where: str, model: str, spec: str, problems) -> bool:
    """A block size must divide the model's context (a full-context sequence fills whole
    blocks) and fit the pool (``pool_tokens``: what the pool holds at this block size
    and KV spec; 0 when not one block fits). False when a problem was recorded."""
    if context_tokens % block_size:
        problems.add(where, f"block_size={block_size} does not divide the context of model "
                            f"{model!r} ({context_tokens} tokens)")
        return False
    if pool_tokens < block_size:
        problems.add(where, f"block_size={block_size} exceeds the pool: kv_memory holds no "
                            f"whole block of {block_size} tokens with KV spec {spec!r} on "
                            f"model {model!r}")
        return False
    return True
