"""Applies a selection policy inside the engine, after each step.

When a sequence's prompt has just been computed and it holds more slots than its
budget, or when decoding has grown it one block past the budget, every layer is scored
and compacted to exactly ``budget`` slots, and the freed tail blocks go back to the
pool. Between compressions a sequence holds at most ``budget + block_size - 1`` slots.

H2O-style policies keep, per request and layer, the attention each slot has received
so far; compaction gathers it along with the kept slots.
"""
from __future__ import annotations

import torch

from kvmap.kv.cache import PagedKVCache
from kvmap.kv.compaction import compact_layer, read_sequence, release_tail
from kvmap.kv.policies.base import Policy, ScoreInputs
from kvmap.model.attention import AttentionMetadata
from kvmap.request import Request


class PolicyRunner:
    def __init__(self, policy: Policy, kv: PagedKVCache, seed: int = 0):
        self.policy = policy
        self.kv = kv
        self.num_layers = kv.geom.num_layers
        self.generator = torch.Generator().manual_seed(seed)
        self.num_compressions = 0
        self.num_evicted_tokens = 0     # slot-tokens dropped, per layer (summed / layers)

    def budget(self, req: Request) -> int:
        return self.policy.budget_tokens(req.num_prompt_tokens)

    def after_step(self, items: list[tuple[Request, int]], meta: AttentionMetadata) -> None:
        """``items`` as run (decodes first), with their counters already advanced."""
        decode_row, prefill_idx = 0, 0
        for req, n in items:
            is_decode = decode_row < meta.num_decode
            where = decode_row if is_decode else prefill_idx
            if is_decode:
                decode_row += 1
            else:
                prefill_idx += 1
            self._accumulate(req, meta, is_decode, where)
            budget = self.budget(req)
            prompt_done = not is_decode and req.num_computed_tokens == req.num_tokens
            over = req.num_kv_slots - budget
            if (prompt_done and over > 0) or (is_decode and over >= self.kv.block_size):
                self._compress(req, budget, meta, is_decode, where)

    def _accumulate(self, req: Request, meta: AttentionMetadata, is_decode: bool,
                    where: int) -> None:
        if not self.policy.needs_accumulated_attention:
            return
        acc = getattr(req, "policy_acc", None) or [None] * self.num_layers
        for layer in range(self.num_layers):
            stats = meta.scores[layer]
            new = (stats["decode"][where, :, :req.num_kv_slots] if is_decode
                   else stats["accumulated"][where])                      # (H, L_now)
            old = acc[layer]
            if old is not None:
                new = new.clone()
                new[:, :old.shape[1]] += old
            acc[layer] = new
        req.policy_acc = acc

    def _compress(self, req: Request, budget: int, meta: AttentionMetadata,
                  is_decode: bool, where: int) -> None:
        L = req.num_kv_slots
        acc = getattr(req, "policy_acc", None)
        for layer in range(self.num_layers):
            k, v = read_sequence(self.kv, layer, req.block_ids, L)
            window = None
            if self.policy.needs_window_attention:
                stats = meta.scores[layer]
                window = (stats["decode"][where, :, None, :L] if is_decode
                          else stats["window"].get(where))
            inputs = ScoreInputs(layer, k, v, window, acc[layer] if acc else None,
                                 req.num_prompt_tokens, self.generator)
            kept = self.policy.select(inputs, budget)                     # (H, budget)
            compact_layer(self.kv, layer, req.block_ids, k, v, kept)
            if acc:
                acc[layer] = torch.gather(acc[layer], 1, kept)
        req.block_ids = release_tail(self.kv, req.block_ids, budget)
        req.num_kv_slots = budget
        req.evicted = True
        self.num_compressions += 1
        self.num_evicted_tokens += L - budget
