"""Turns a scheduled batch into model inputs, runs the model, returns logits.

For each scheduled (request, n) it lays out n tokens on the flat token axis, with

    positions  = num_computed_tokens ... num_computed_tokens + n - 1
    KV slots   = slot(num_kv_slots) ... slot(num_kv_slots + n - 1)
    slot(i)    = block_ids[i // block_size] * block_size + i % block_size

Positions and KV slot indices differ once a selection policy has evicted tokens, or
once a sequence is paged through the tiers (its ``block_ids`` / ``num_kv_slots`` are
then the resident part after its paged-out front): the rotary position of a new token
still counts every token of the sequence. What attention needs from the tiers -- a
paged sequence's front, prefix blocks still being copied in -- the runner asks the
engine's ``Offloader`` once a step (``meta.offload``, an ``OffloadStep``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvmap.engine.layer_tables import per_layer_metas, window_sources
from kvmap.kv.cache import PagedKVCache
from kvmap.kv.offload.offloader import Offloader
from kvmap.model.attention import AttentionMetadata, LayerHoles, PrefillSegment
from kvmap.request import Request


@dataclass(frozen=True)
class StepInputs:
    """The model's inputs for one scheduled batch (``ModelRunner.build``)."""

    input_ids: torch.Tensor         # (T,) the batch's new tokens, decodes first
    positions: torch.Tensor         # (T,) their rotary positions
    meta: AttentionMetadata
    sample_rows: torch.Tensor       # (N,) token rows whose logits are sampled
    sampled: list[Request]          # the requests of those rows, in order


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
    def __init__(self, model, kv: PagedKVCache, offload: Offloader | None = None):
        """``model``: a decoder (``kvmap.model.decoders``) over ``kv``; ``offload``: the
        tiers below the pool, or None."""
        self.model = model
        self.kv = kv
        self.offload = offload          # the tiers below the pool, or None
        self.device = model.device
        self.fused_reads = True         # False: decode dequantizes through codec.read

    def build(self, items: list[tuple[Request, int]], policy=None) -> StepInputs:
        """Flat inputs for the batch. Decodes must come first in ``items``."""
        bs = self.kv.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_ids: list[int] = []
        decode_tables, decode_lens, prefills = [], [], []
        sample_rows: list[int] = []
        sampled: list[Request] = []
        decode_reqs, prefill_reqs = [], []
        holes: dict = {}       # layer -> LayerHoles: a selection policy's per-layer holes
        for req, n in items:
            start = len(input_ids)
            c = req.num_computed_tokens
            input_ids += req.token_ids[c:c + n]
            positions += range(c, c + n)
            slot_ids += slot_ids_of(req.block_ids, req.num_kv_slots, n, bs)
            num_kv_after = req.num_kv_slots + n
            if n == 1 and not prefills and c == req.num_tokens - 1:
                decode_reqs.append(req)
                row = ("decode", len(decode_tables))
                decode_tables.append(req.block_ids[: -(-num_kv_after // bs)])
                decode_lens.append(num_kv_after)
            else:
                prefill_reqs.append(req)
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
        meta.holes = holes
        meta.fused_reads = self.fused_reads
        if self.offload is not None:     # paged fronts, prefix blocks still being copied in
            meta.offload = self.offload.step(decode_reqs, prefill_reqs)
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
        return StepInputs(torch.tensor(input_ids, dtype=torch.long, device=dev),
                          torch.tensor(positions, dtype=torch.long, device=dev), meta,
                          torch.tensor(sample_rows, dtype=torch.long, device=dev), sampled)

    def run(self, items: list[tuple[Request, int]], policy=None) -> StepOutput:
        inputs = self.build(items, policy)
        meta, sampled = inputs.meta, inputs.sampled
        hidden = self.model(inputs.input_ids, inputs.positions, meta, self.kv)
        if meta.offload.loads is not None:
            self.offload.finish_loads()
        # every token sampled (all decodes): the rows are 0..T-1, no gather needed
        rows = hidden if len(sampled) == hidden.shape[0] else hidden[inputs.sample_rows]
        logits = self.model.logits(rows) if sampled else hidden.new_empty(0)
        if self.device.type == "cuda":      # the engine times the run (cost model, stats)
            torch.cuda.synchronize(self.device)
        return StepOutput(logits, sampled, meta, hidden)
