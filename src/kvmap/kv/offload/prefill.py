"""Prefill through the tiers: query-aware selection with a small peak.

``snapkv(budget=B, prefill=offload)+tiers(host=...)``. Final-only SnapKV scores the
prompt with its last ``window`` queries (the question), so the whole prompt used to be
resident until then: peak device KV ~ the full cache. Scoring chunk by chunk caps the
peak but scores with ordinary text and loses what the question asks for. With
``prefill=offload`` the prompt goes through the tier store's pager instead:

1. after each prefill chunk but the last, the sequence's full resident blocks go down
   to the top tier level a page at a time (``Pager.page_out_all``; fewer than
   ``page_blocks`` full blocks and the partial one stay) and the scheduler frees their
   pool blocks (``Scheduler.apply_page_out``);
2. the next chunk attends to the paged-out front exactly, by log-sum-exp merging
   (``kvmap.model.attention``, as any paged sequence does);
3. the chunk that completes the prompt (at least ``window`` tokens, the scheduler's
   ``min_last_chunk``) computes the observation window's attention over *every* key,
   paged-out ones included (``_window_attention(front=...)``): the same scores as
   end-of-prefill SnapKV over one resident prompt;
4. the policy runner then selects per layer over all tokens, reads each layer back
   (front from the tier + resident part, one layer at a time: ``read_layer``), writes
   only the kept tokens into pool blocks (``kvmap.kv.compaction``) and drops the pages.

Peak device KV (pool blocks) of one request without a prefix hit, block size ``bs``,
page ``P`` blocks, prefill chunks of ``C`` tokens, budget ``B`` (``peak_blocks`` replays
it exactly)::

    prefill      <= P + ceil((C - 1) / bs)          (< P full blocks + partial + chunk)
    compression  =  max(resident blocks, ceil(B / bs))   (dst reuses resident blocks)
    decode       =  ceil((B + e) / bs)              (e = decode_every, default bs)

so at 4k tokens, B = 1,024, C = 512, bs = P = 16: 65 blocks of a full cache's 257.

Limits: a prefix taken from the pool at admission is resident until its first chunk
is computed; if the pool has no block for the kept tokens when the prompt completes
(``PolicyRunner.num_deferred``), the sequence stays paged and decodes over its whole
context (the full cache's attention, exact) instead of being compressed.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from kvmap.kv.compaction import read_sequence
from kvmap.kv.offload.decisions import PageOut


def offloads(policy: Any) -> bool:
    """True if ``policy`` prefills through the tiers (``prefill=offload``)."""
    return bool(getattr(policy, "prefill_offload", False))


def check_spec(text: str, policy: Any, tiers: Any) -> None:
    """Parse time: ``prefill=offload`` needs a tier level to page the prompt into."""
    if not offloads(policy):
        return
    if not getattr(tiers, "levels", ()):
        has = (f"its layout {tiers.name!r} has no tier levels" if tiers is not None
               else "it has no tiers(...) part")
        raise ValueError(f"KV spec {text!r}: {policy.name}(prefill=offload) pages the prompt "
                         f"through the tiers, but {has}; add e.g. tiers(host=1GiB)")


class OffloadPrefill:
    """The offloading side of prefill through the tiers, for the policy runner."""

    def __init__(self, offload, kv) -> None:
        self.offload = offload       # the engine's Offloader
        self.kv = kv

    def num_offloaded(self, req) -> int:
        return self.offload.num_offloaded_tokens(req)

    def num_slots(self, req) -> int:
        """Every KV slot of ``req``: its paged-out front and its resident part."""
        return self.num_offloaded(req) + req.num_kv_slots

    def after_chunk(self, req) -> PageOut | None:
        """A prefill chunk of ``req`` that does not complete its prompt is written:
        its whole pages go to the tiers. Returns them, for the caller to free."""
        return self.offload.page_out_all(req)

    def read_layer(self, req, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of every slot of ``req`` in ``layer``, each (num_slots, H, D) in time
        order: the paged-out front read back from the tier, then the resident part."""
        k, v = read_sequence(self.kv, layer, req.block_ids, req.num_kv_slots)
        front = self.offload.read_front(req, layer)                       # (H, Lo, D)
        if front is None:
            return k, v
        k_off, v_off = front
        return (torch.cat([k_off.transpose(0, 1), k]), torch.cat([v_off.transpose(0, 1), v]))

    def release(self, req) -> None:
        """The kept tokens are in pool blocks: delete ``req``'s pages from the tiers."""
        self.offload.drop(req.request_id)


def chunk_sizes(num_prompt_tokens: int, chunk_tokens: int, min_last_chunk: int) -> list[int]:
    """The prefill chunks the scheduler runs for one request alone (its
    ``_num_new_tokens``: a last chunk is never shorter than ``min_last_chunk``)."""
    sizes, done = [], 0
    while done < num_prompt_tokens:
        remaining = num_prompt_tokens - done
        n = min(remaining, chunk_tokens)
        if 0 < remaining - n < min_last_chunk < remaining:
            n = remaining - min_last_chunk
        sizes.append(n)
        done += n
    return sizes


def peak_blocks(num_prompt_tokens: int, chunk_tokens: int, block_size: int,
                page_blocks: int, budget_tokens: int, window: int,
                num_decode_steps: int = 0, decode_every: int | None = None) -> int:
    """Most pool blocks one request holds with ``prefill=offload`` (module docstring):
    the chunk schedule replayed, pages out after every chunk but the last, the
    compression into ``ceil(budget / bs)`` blocks (reusing the resident ones), then
    ``num_decode_steps`` decode steps compressed every ``decode_every`` (default: one
    block). No prefix hit, every frame accepted by the tier."""
    bs = block_size
    slots, peak = 0, 0
    sizes = chunk_sizes(num_prompt_tokens, chunk_tokens, window)
    for i, n in enumerate(sizes):
        peak = max(peak, math.ceil((slots + n) / bs))   # allocated before the chunk runs
        slots += n
        if i < len(sizes) - 1:
            while slots // bs >= page_blocks:
                slots -= page_blocks * bs
    if budget_tokens >= num_prompt_tokens:    # never compressed: stays paged
        return max(peak, math.ceil((slots + num_decode_steps) / bs))
    peak = max(peak, math.ceil(budget_tokens / bs))
    every = bs if decode_every is None else decode_every
    grown = num_decode_steps if every == 0 else min(num_decode_steps, every)
    return max(peak, math.ceil((budget_tokens + grown) / bs))


def check_fits(policy: Any, num_prompt_tokens: int, max_tokens: int, chunk_tokens: int,
               block_size: int, page_blocks: int, pool_blocks: int) -> None:
    """At admission: a prompt prefilled through the tiers needs only its peak in the
    pool, not its length (so it may be larger than the pool). Raises ValueError naming
    both when the pool is smaller than that peak."""
    need = peak_blocks(num_prompt_tokens, chunk_tokens, block_size, page_blocks,
                       policy.budget_tokens(num_prompt_tokens), policy.observation_window,
                       num_decode_steps=max(0, max_tokens - 1),
                       decode_every=policy.decode_every_steps(block_size))
    if need > pool_blocks:
        raise ValueError(
            f"prompt of {num_prompt_tokens} tokens with {policy!r} holds up to {need} KV "
            f"blocks at once (page_blocks={page_blocks}, {chunk_tokens}-token prefill "
            f"chunks, its budget, {max_tokens} new tokens); the pool has {pool_blocks}")
