"""Whether a prompt can ever run in a pool of ``pool_blocks`` blocks, checked when it is
added (``Engine.add_request``), before any work starts.

- it fits the pool: yes;
- ``prefill=offload`` (``prefill.py``): only its peak must fit, not its length;
- larger than the pool: only with tiers that page it (``pager.py``), and only when the
  pool holds a page being written out, a full step's prefill chunk and a partial block.
"""
from __future__ import annotations

from typing import Any

from kvmap.kv.offload.prefill import check_fits, offloads


def check_prompt(num_prompt_tokens: int, max_tokens: int, block_size: int, pool_blocks: int,
                 chunk_tokens: int, policy: Any, offload: Any,
                 need_blocks: int | None = None) -> None:
    """Raise ValueError naming the numbers when a prompt of ``num_prompt_tokens`` can
    never run. ``chunk_tokens``: the step's token budget; ``policy``: the KV spec's
    selection policy or None; ``offload``: the engine's ``Offloader`` or None;
    ``need_blocks``: the pool blocks the prompt holds at its peak (default: one per
    ``block_size`` tokens; a hybrid model's sliding layers hold less,
    ``PagedKVCache.peak_blocks``)."""
    if need_blocks is None:
        need_blocks = -(-num_prompt_tokens // block_size)
    if offloads(policy):               # pages its own prompt: only its peak must fit
        check_fits(policy, num_prompt_tokens, max_tokens, chunk_tokens, block_size,
                   offload.page_blocks, pool_blocks)
        need_blocks = min(need_blocks, pool_blocks)
    if need_blocks <= pool_blocks:
        return
    head = f"prompt of {num_prompt_tokens} tokens needs {need_blocks} KV blocks"
    if offload is not None and not offload.paging:
        why = (f"a selection policy ({policy!r}) compresses resident blocks only"
               if policy is not None else "a model with sliding-window layers")
        raise ValueError(f"{head}; the pool has {pool_blocks}, and {why}, so it is not "
                         f"paged through the tiers (raise kv_memory)")
    if offload is None:
        raise ValueError(f"{head}; the pool has {pool_blocks} (raise kv_memory, or add "
                         f"tiers(...) to the KV spec to page it)")
    # paging keeps a page being written out, a full step's chunk and a partial block
    chunk = min(num_prompt_tokens, chunk_tokens)
    least = offload.page_blocks + -(-chunk // block_size) + 1
    if pool_blocks < least:
        raise ValueError(
            f"{head}; paging it through the tiers needs a pool of at least {least} "
            f"(page_blocks={offload.page_blocks} + a {chunk}-token prefill chunk + 1), "
            f"the pool has {pool_blocks}")
