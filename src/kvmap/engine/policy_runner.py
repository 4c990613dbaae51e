"""Applies a selection policy inside the engine, after each step.

A sequence is compressed -- every layer scored and compacted to exactly ``budget``
slots, the freed tail blocks back to the pool -- when it holds more slots than its
budget after

- a prefill chunk, if the policy is ``chunked`` (the peak is then budget + one chunk);
- the chunk that completes its prompt, otherwise (the whole prompt is resident first);
- a decode step that has grown it ``decode_every`` slots past the budget (the policy's
  option, by default one block; 0 = never: ``Policy.decode_every_steps``).

Once its prompt is done a sequence holds at most ``budget + decode_every - 1`` slots.

Compaction writes only into blocks the sequence alone holds (copy on write: a prefix
block shared with another request is left as it is, ``kvmap.kv.compaction``). With
``evict_to=LEVEL`` (soft eviction) the prompt's hashed blocks are first kept in that
tier level under their prefix hash, for a later request sharing the prefix.

H2O-style policies keep, per request and layer, the attention each slot has received
so far; compaction gathers it along with the kept slots.

Per-layer budgets (``layer_budgets``): the block table serves every layer, so the
sequence holds ``budget = max(layer budgets)`` slots and layer l keeps its b_l tokens in
slots 0..b_l-1. Its slots b_l..budget-1 are a hole, named in ``req.kv_holes`` (layer ->
(first, end) slot) for attention to mask out (``AttentionMetadata.hidden``) and left
out of the next selection; new tokens go after ``budget`` as usual:

    layer 0 (b=6): [k k k k k k|n n]        budget = 6, two new tokens
    layer 1 (b=3): [k k k . . .|n n]        hole (3, 6)

With per-layer block tables (the cache's ``per_layer_tables``, on for ``layer_budgets``:
``kvmap.kv.layer_pool``) the blocks wholly inside a hole go back to the pool
(``PagedKVCache.release_holes``); the slot layout, and so attention, is the same.

A hybrid model's sliding-window layers are left alone by the policy
(``kvmap.kv.layer_kinds``): they are not scored, and compaction moves their last
``n = min(W - 1, budget)`` tokens -- all the next query sees -- to the end of the
compacted range, so slot distance stays position distance for their window mask:

    global  (budget 6):  [k k k k k k|n]        policy's choice
    sliding (W = 4):     [. . . r r r|n]        last W - 1 = 3 tokens, in time order
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from kvmap.kv.cache import PagedKVCache
from kvmap.kv.compaction import (compact_layer, destination_blocks, read_sequence,
                                 release_blocks, slots_of)
from kvmap.kv.offload.decisions import PageOut
from kvmap.kv.offload.offloader import Offloader
from kvmap.kv.offload.prefill import OffloadPrefill, offloads
from kvmap.kv.policies.base import Policy, ScoreInputs
from kvmap.model.attention import AttentionMetadata
from kvmap.request import Request


class PolicyRunner:
    def __init__(self, policy: Policy, kv: PagedKVCache, seed: int = 0,
                 offload: Offloader | None = None,
                 apply_page_out: Callable[[Request, PageOut | None], bool] | None = None):
        """``offload``: the engine's tiers (``evict_to``, ``prefill=offload``);
        ``apply_page_out``: frees what a page-out took (``Scheduler.apply_page_out``)."""
        self.policy = policy
        self.kv = kv
        self.num_layers = kv.geom.num_layers
        self.generator = torch.Generator().manual_seed(seed)
        self.num_compressions = 0
        self.num_evicted_tokens = 0     # slot-tokens dropped, per layer (summed / layers)
        self.num_deferred = 0           # compressions put off: no block for copy on write
        # soft eviction (``evict_to``): the tier level that keeps what compaction drops
        self.evict_to = getattr(policy, "evict_to", None)
        self.offloader = offload
        # prefill through the tiers (``prefill=offload``, ``kvmap.kv.offload.prefill``)
        self.offload = OffloadPrefill(offload, kv) if offloads(policy) else None
        self.apply_page_out = apply_page_out

    def layer_budgets(self, req: Request) -> list[int]:
        budgets = req.policy_layer_budgets
        if budgets is None:
            budgets = req.policy_layer_budgets = self.policy.layer_budget_tokens(
                req.num_prompt_tokens, self.num_layers)
        return budgets

    def budget(self, req: Request) -> int:
        """Slots the sequence is compressed to: the largest layer budget."""
        return max(self.layer_budgets(req))

    def reserve_slots(self, req: Request, num_new: int) -> int:
        """``prefill=offload``: the chunk that completes a prompt also takes the blocks
        its kept tokens go to (the scheduler preempts for them as for any block), so
        the compression after it never waits for a block while the window's scores are
        at hand. 0 for every other step."""
        if num_new == 1 or req.num_computed_tokens + num_new != req.num_tokens:
            return 0
        budget = self.budget(req)
        return budget if self.offload.num_slots(req) + num_new > budget else 0

    def after_step(self, items: list[tuple[Request, int]], meta: AttentionMetadata) -> None:
        """``items`` as run (decodes first), with their counters already advanced."""
        decode_row, prefill_idx = 0, 0
        step_scores = self._decode_scores(meta)
        for req, n in items:
            is_decode = decode_row < meta.num_decode
            where = decode_row if is_decode else prefill_idx
            if is_decode:
                decode_row += 1
            else:
                prefill_idx += 1
            self._accumulate(req, meta, is_decode, where, step_scores)
            budget = self.budget(req)
            paged = self.offload is not None and self.offload.num_offloaded(req) > 0
            over = (self.offload.num_slots(req) if paged else req.num_kv_slots) - budget
            if is_decode:
                every = self.policy.decode_every_steps(self.kv.block_size)
                # still paged after its prompt (compression deferred): decodes exactly
                due = every > 0 and over >= every and not paged
            else:
                prompt_done = req.num_computed_tokens == req.num_tokens
                due = over > 0 and (prompt_done or self.policy.chunked)
                if self.offload is not None and not prompt_done:
                    self.apply_page_out(req, self.offload.after_chunk(req))
            if due:
                self._compress(req, budget, meta, is_decode, where)

    def _decode_scores(self, meta: AttentionMetadata) -> torch.Tensor | None:
        """The decode rows' attention of this step, all layers at once, (num_layers, B,
        H, L) fp32 (one operator, so that a request's accumulation is a few operators
        whatever the number of layers); None when nothing accumulates or the layers'
        key counts differ (per-layer block tables)."""
        if not (self.policy.needs_accumulated_attention and meta.num_decode):
            return None
        per_layer = [meta.scores[layer].decode for layer in range(self.num_layers)]
        if len({t.shape for t in per_layer}) > 1:
            return None
        return torch.stack(per_layer)

    def _accumulate(self, req: Request, meta: AttentionMetadata, is_decode: bool,
                    where: int, step_scores: torch.Tensor | None) -> None:
        """Adds this step's attention to ``req.policy_acc`` (num_layers, H, L_now)."""
        if not self.policy.needs_accumulated_attention:
            return
        L = req.num_kv_slots
        windows = self.kv.geom.windows
        if is_decode and step_scores is not None and not self.kv.geom.sliding_layers:
            new = step_scores[:, where, :, :L]                            # (layers, H, L)
        else:       # a sliding layer is not scored (its window is kept): zeros
            new = torch.stack([
                torch.zeros(self.kv.geom.num_kv_heads, L, device=self.kv.device)
                if windows[layer] is not None
                else meta.scores[layer].decode[where, :, :L] if is_decode
                else meta.scores[layer].accumulated[where] for layer in range(self.num_layers)])
        old = req.policy_acc
        if old is not None:
            new = new.clone()
            new[..., :old.shape[-1]] += old
        req.policy_acc = new

    def _save_evicted(self, req: Request) -> None:
        """Soft eviction: before compaction rewrites or frees them, the sequence's
        prompt blocks that carry a prefix hash (every full block computed before its
        first compression) are written to the ``evict_to`` level under that hash, so a
        later request sharing the prefix fetches them back (the scheduler's prefix
        lookup, ``TieredStore.take_prefix``) instead of recomputing them."""
        if req.evicted:         # already compacted: its blocks no longer hold token blocks
            return
        for block_id, block_hash in zip(req.block_ids, req.block_hashes[:req.num_hashed_blocks]):
            self.offloader.keep_evicted(block_id, block_hash, self.evict_to)

    def _read_layer(self, req: Request, layer: int, num_slots: int):
        if self.offload is not None:
            return self.offload.read_layer(req, layer)
        return read_sequence(self.kv, layer, req.block_ids, num_slots)

    def _window_tails(self, req: Request, budget: int) -> dict[int, list[int]]:
        """Sliding layer -> the groups of ``req.block_ids`` its kept window goes to
        (the slots ``budget - n .. budget - 1``, ``n = min(W - 1, budget)``)."""
        bs, out = self.kv.block_size, {}
        for layer in self.kv.geom.sliding_layers:
            n = min(self.kv.geom.windows[layer] - 1, budget, req.num_kv_slots)
            out[layer] = list(range((budget - n) // bs, -(-budget // bs))) if n else []
        return out

    def _keep_window(self, layer: int, dst: list[int], k: torch.Tensor, v: torch.Tensor,
                     budget: int) -> None:
        """A sliding layer's compaction: its last ``n`` slots (k, v (L, H, D) as read)
        into slots ``budget - n .. budget - 1`` of ``dst``."""
        n = min(self.kv.geom.windows[layer] - 1, budget, k.shape[0])
        if not n:
            return
        slots = slots_of(self.kv.layer_block_ids(layer, dst[:-(-budget // self.kv.block_size)]),
                         budget, self.kv.block_size)[budget - n:].to(self.kv.device)
        self.kv.codec.write(self.kv.layers[layer], slots, k[-n:].contiguous(),
                            v[-n:].contiguous())

    def _compress(self, req: Request, budget: int, meta: AttentionMetadata,
                  is_decode: bool, where: int) -> None:
        L = self.offload.num_slots(req) if self.offload is not None else req.num_kv_slots
        tails = self._window_tails(req, budget) if self.kv.per_layer_tables else {}
        need = sum(self.kv.pool.members[req.block_ids[j], layer] < 0
                   for layer, groups in tails.items() for j in groups)
        if need > len(getattr(self.kv.pool, "free_layer_blocks", ())):
            self.num_deferred += 1      # no block to write a sliding window back into
            return
        for layer, groups in tails.items():
            for j in groups:
                self.kv.pool.acquire(req.block_ids[j], layer)
        dst = destination_blocks(self.kv, req.block_ids, budget)
        if dst is None:         # no block to copy shared ones into: retry next step
            self.num_deferred += 1
            return
        if self.evict_to is not None:
            self._save_evicted(req)
        acc = req.policy_acc
        # a preempted request restarts with evicted=False: its old holes no longer apply
        holes = (req.kv_holes if req.evicted else None) or {}
        new_holes, kept_accs = {}, []
        windows = self.kv.geom.windows
        for layer, layer_budget in enumerate(self.layer_budgets(req)):
            k, v = self._read_layer(req, layer, L)
            if windows[layer] is not None:            # left alone: its window, moved
                self._keep_window(layer, dst, k, v, budget)
                if acc is not None:
                    kept_accs.append(torch.zeros(acc.shape[1], budget, device=acc.device))
                continue
            window = None
            if self.policy.needs_window_attention:
                stats = meta.scores[layer]
                window = (stats.decode[where, :, None, :L] if is_decode
                          else stats.window.get(where))
            layer_acc = acc[layer] if acc is not None else None
            if layer in holes:                    # score only the slots the layer holds
                first, end = holes[layer]
                valid = torch.cat([torch.arange(first, device=k.device),
                                   torch.arange(end, L, device=k.device)])
                k, v = k[valid], v[valid]
                window = window[..., valid] if window is not None else None
                layer_acc = layer_acc[:, valid] if layer_acc is not None else None
            inputs = ScoreInputs(layer, k, v, window, layer_acc, req.num_prompt_tokens,
                                 self.generator)
            kept = self.policy.select(inputs, layer_budget)           # (H, layer_budget)
            compact_layer(self.kv, layer, dst, k, v, kept)
            if layer_acc is not None:
                kept_acc = torch.zeros(layer_acc.shape[0], budget, device=layer_acc.device)
                kept_acc[:, :kept.shape[1]] = torch.gather(layer_acc, 1, kept)
                kept_accs.append(kept_acc)
            if kept.shape[1] < budget:
                new_holes[layer] = (kept.shape[1], budget)
        if kept_accs:
            req.policy_acc = torch.stack(kept_accs)                   # (layers, H, budget)
        req.kv_holes = new_holes or None
        req.block_ids = release_blocks(self.kv, req.block_ids, dst)
        if self.offload is not None:
            self.offload.release(req)          # the kept tokens are back in the pool
        self.kv.release_holes(req.block_ids, req.kv_holes)     # per-layer tables only
        req.num_slid_out_blocks = self.kv.release_slid_out(req.block_ids, budget, 0)
        req.num_kv_slots = budget
        req.evicted = True
        self.num_compressions += 1
        self.num_evicted_tokens += L - budget
