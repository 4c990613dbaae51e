"""Turns a scheduled batch into model inputs, runs the model, returns logits.

For each scheduled (request, n) it lays out n tokens on the flat token axis, with

    positions  = num_computed_tokens ... num_computed_tokens + n - 1
    KV slots   = slot(num_kv_slots) ... slot(num_kv_slots + n - 1)
    slot(i)    = block_ids[i // block_size] * block_size + i % block_size

Positions and KV slot indices differ once a selection policy has evicted tokens, or
once a sequence is paged through the tiers (its ``block_ids`` / ``num_kv_slots`` are
then the resident part after its paged-out front): the rotary position of a new token
still counts every token of the sequence. A paged sequence's front is handed to
attention as an ``OffloadedContext`` (``meta.offloaded_decode`` / ``offloaded_prefill``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvmap.engine.layer_tables import per_layer_metas, window_sources
from kvmap.kv.cache import PagedKVCache
from kvmap.model.attention import AttentionMetadata, LayerHoles, PrefillSegment
from kvmap.request import Request


@dataclass
class StepOutput:
    logits: torch.Tensor            # (N, V) fp32 for the requests in ``sampled``
    sampled: list[Request]          # requests that get a new token this step
    meta: AttentionMetadata
    hidden: torch.Tensor            # (T, hidden) final hidden states of every token


def slot_ids_of(block_ids: list[int], start: int, count: int, block_size: int) -> list[int]:
    return [block_ids[i // block_size] * block_size + i % block_size
            for i in range(start, start + count)]


class ModelRunner:
    def __init__(self, model, kv: PagedKVCache):
        """``model``: a decoder (``kvmap.model.decoders``) over ``kv``."""
        self.model = model
        self.kv = kv
        self.device = model.device

    def build(self, items: list[tuple[Request, int]], policy=None):
        """Flat inputs for the batch. Decodes must come first in ``items``."""
        bs = self.kv.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_ids: list[int] = []
        decode_tables, decode_lens, prefills = [], [], []
        sample_rows: list[int] = []
        sampled: list[Request] = []
        pager = self.kv.tiers.pager if self.kv.tiers is not None else None
        offloaded_decode, offloaded_prefill = {}, {}
        holes: dict = {}       # layer -> LayerHoles: a selection policy's per-layer holes
        for req, n in items:
            ctx = pager.context(req) if pager is not None else None
            start = len(input_ids)
            c = req.num_computed_tokens
            input_ids += req.token_ids[c:c + n]
            positions += range(c, c + n)
            slot_ids += slot_ids_of(req.block_ids, req.num_kv_slots, n, bs)
            num_kv_after = req.num_kv_slots + n
            if n == 1 and not prefills and c == req.num_tokens - 1:
                if ctx is not None:
                    offloaded_decode[len(decode_tables)] = ctx
                row = ("decode", len(decode_tables))
                decode_tables.append(req.block_ids[: -(-num_kv_after // bs)])
                decode_lens.append(num_kv_after)
            else:
                if ctx is not None:
                    offloaded_prefill[len(prefills)] = ctx
                nb = -(-num_kv_after // bs)
                row = ("prefill", len(prefills))
                prefills.append(PrefillSegment(
                    start, start + n,
                    torch.tensor(req.block_ids[:nb], dtype=torch.long, device=self.device),
                    num_kv_after, completes_prompt=c + n == req.num_tokens))
            for layer, hole in ((req.kv_holes if req.evicted else None) or {}).items():
                getattr(holes.setdefault(layer, LayerHoles()), row[0])[row[1]] = hole
            if c + n == req.num_tokens:          # the chunk reaches the end: sample
                sample_rows.append(start + n - 1)
                sampled.append(req)
        dev = self.device
        meta = AttentionMetadata.build(
            torch.tensor(slot_ids, dtype=torch.long, device=dev), decode_tables, decode_lens,
            prefills, bs, dev, self.model.dtype)
        meta.offloaded_decode, meta.offloaded_prefill = offloaded_decode, offloaded_prefill
        meta.holes = holes
        if policy is not None and (policy.needs_window_attention
                                   or policy.needs_accumulated_attention):
            meta.want_scores = True
            meta.observation_window = policy.observation_window
            meta.accumulate = policy.needs_accumulated_attention
        windows = self.kv.geom.windows
        sources = window_sources(meta, windows, decode_tables, decode_lens, bs) \
            if self.kv.geom.sliding_layers else None
        if self.kv.per_layer_tables:
            meta.layers = per_layer_metas(meta, self.kv.pool, sources)
        elif sources is not None:    # shared table: sliding layers keep all, masked
            meta.layers = sources
        if self.kv.tiers is not None:     # prefix blocks still being copied in, per layer
            meta.layer_loads = self.kv.tiers.loads.pending()
        return (torch.tensor(input_ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev), meta,
                torch.tensor(sample_rows, dtype=torch.long, device=dev), sampled)

    def run(self, items: list[tuple[Request, int]], policy=None) -> StepOutput:
        input_ids, positions, meta, sample_rows, sampled = self.build(items, policy)
        hidden = self.model(input_ids, positions, meta, self.kv)
        if meta.layer_loads is not None:
            self.kv.tiers.finish_loads()
        # every token sampled (all decodes): the rows are 0..T-1, no gather needed
        rows = hidden if len(sampled) == hidden.shape[0] else hidden[sample_rows]
        logits = self.model.logits(rows) if sampled else hidden.new_empty(0)
        if self.device.type == "cuda":      # the engine times the run (cost model, stats)
            torch.cuda.synchronize(self.device)
        return StepOutput(logits, sampled, meta, hidden)
