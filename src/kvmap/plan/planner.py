"""``plan_capacity``: one model, GPU setup and KV configuration -> a :class:`CapacityPlan`.

The arithmetic is :mod:`kvmap.plan.capacity`'s; this module only gathers the inputs (exact
block bytes from the codec, weight bytes, the GPU's memory) and names the results.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from kvmap.kv.config import KVConfig
from kvmap.kv.layer_kinds import KVLayout, layer_kind_notes
from kvmap.kv.layer_pool import per_layer_tables_blocker
from kvmap.kv.spec import KVGeometry
from kvmap.plan import capacity
from kvmap.plan.catalogue import GPU, PlanModel
from kvmap.perf.weights import weight_bytes
from kvmap.plan.layer_kind_plan import context_limit_notes, layer_kind_figures, layout_notes


@dataclass(frozen=True)
class CapacityPlan:
    """Figures for one KV configuration. Per-GPU figures are for each of ``num_gpus``."""

    model: str
    gpu: str
    num_gpus: int
    kv_spec: str
    weights_format: str
    block_size: int
    context_tokens: int
    concurrency: int
    kv_bytes_per_token: float          # whole model, all layers, all KV heads, scales included
    num_kv_heads_per_gpu: int
    kv_bytes_per_block_per_gpu: int    # block_size tokens, all layers, this GPU's heads
    resident_tokens_per_seq: int       # at context_tokens, after policy and sliding window
    blocks_per_seq: int
    kv_bytes_per_seq: int              # blocks_per_seq blocks on every GPU
    weight_bytes: int                  # all GPUs together
    weight_bytes_per_gpu: int
    memory_bytes_per_gpu: int
    usable_kv_bytes_per_gpu: int       # negative: the weights do not fit
    num_blocks_per_gpu: int
    max_concurrent_seqs: int           # at context_tokens
    max_context_tokens: int | None     # at `concurrency` sequences, by memory; None: unbounded
    model_max_context_tokens: int
    decode_step_s: float               # `concurrency` sequences at context_tokens
    decode_step_s_at_max_seqs: float   # max_concurrent_seqs sequences (nan when 0)
    notes: tuple[str, ...] = ()
    # "per-layer": the engine frees each layer's hole (``layer_budgets``); bytes per
    # sequence are then layer_blocks_per_seq layer blocks, blocks_per_seq rounded up
    layer_tables: str = "shared"
    layer_blocks_per_seq: int | None = None
    # per layer kind (kvmap.plan.layer_kind_plan): its layers, window, bytes per token,
    # resident tokens / bytes per sequence and decode read at context_tokens, and what
    # the codec, a policy and tiers do to it
    layer_kinds: dict | None = None
    # linear-attention / SSM layers' fixed state per sequence (in kv_bytes_per_seq too)
    state_bytes_per_seq: int = 0

    @property
    def usable_max_context_tokens(self) -> int:
        """``max_context_tokens`` bounded by the model's own limit (its
        ``max_position_embeddings``): the longest context to plan for."""
        memory = self.max_context_tokens
        return self.model_max_context_tokens if memory is None \
            else min(memory, self.model_max_context_tokens)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["usable_max_context_tokens"] = self.usable_max_context_tokens
        if math.isnan(d["decode_step_s_at_max_seqs"]):
            d["decode_step_s_at_max_seqs"] = None
        return d


def plan_capacity(model: PlanModel, gpu: GPU, kv: str | KVConfig = "bf16", *,
                  context_tokens: int | None = None, concurrency: int = 1, num_gpus: int = 1,
                  weights: str = "bf16", block_size: int = 16,
                  gpu_memory_utilization: float = capacity.GPU_MEMORY_UTILIZATION,
                  reserve_bytes_per_gpu: int = capacity.RESERVE_BYTES_PER_GPU) -> CapacityPlan:
    """Plan ``model`` on ``num_gpus`` x ``gpu`` with KV configuration ``kv``.

    ``context_tokens`` defaults to the model's ``max_position_embeddings``. Raises
    ValueError naming the bad value (spec, weights format, GPU count, context).
    """
    kv = KVConfig.parse(kv)
    c = model.config
    context_tokens = c.max_position_embeddings if context_tokens is None else context_tokens
    _check_concurrency(concurrency)
    heads_per_gpu = capacity.kv_heads_per_gpu(c.num_kv_heads, c.num_heads, num_gpus)
    geom_gpu = KVGeometry(c.num_layers, heads_per_gpu, c.head_dim, block_size)
    geom_model = KVGeometry.of(c, block_size)
    kv.codec.validate_geometry(geom_gpu)
    block_bytes_gpu = kv.codec.block_bytes(geom_gpu, capacity.COMPUTE_DTYPE)
    bytes_per_token = kv.codec.block_bytes(geom_model, capacity.COMPUTE_DTYPE) / block_size

    # a window on every layer (Mistral v0.1) caps every layer; a hybrid model's sliding
    # layers are counted per layer (hybrid_layer_blocks)
    window = c.sliding_window if c.sliding_layers is None else None
    windows = geom_model.layer_windows
    blocks_per_seq = capacity.resident_blocks(context_tokens, block_size, kv.policy, window, num_layers=c.num_layers)
    all_weight_bytes = weight_bytes(model, weights)
    weight_bytes_gpu = math.ceil(all_weight_bytes / num_gpus)
    usable = capacity.usable_kv_bytes_per_gpu(gpu.memory_bytes, weight_bytes_gpu, gpu_memory_utilization,
                                              reserve_bytes_per_gpu)
    num_blocks = kv.codec.num_blocks_in(usable, geom_gpu, capacity.COMPUTE_DTYPE)   # + staging
    max_seqs = num_blocks // blocks_per_seq
    layout = model.layout or KVLayout.of_config(c)
    state_all = layout.state_bytes_per_seq()
    state_gpu = math.ceil(state_all / num_gpus)          # linear heads split over the GPUs
    seq_bytes_gpu = blocks_per_seq * block_bytes_gpu
    has_tiers = kv.tiers is not None and bool(kv.tiers.levels)
    per_layer = capacity.per_layer_tables(kv, c, block_size, has_tiers)
    layer_blocks = None
    layer_block_bytes = kv.codec.block_bytes(replace(geom_gpu, num_layers=1), capacity.COMPUTE_DTYPE)
    if per_layer:
        layer_blocks = capacity.resident_layer_blocks(
            context_tokens, block_size, kv.policy, num_layers=c.num_layers) \
            if windows is None else capacity.hybrid_layer_blocks(
                context_tokens, block_size, kv.policy, windows)
        seq_bytes_gpu = layer_blocks * layer_block_bytes
        blocks_per_seq = math.ceil(layer_blocks / c.num_layers)
        max_seqs = num_blocks * c.num_layers // layer_blocks

    if state_gpu:        # each sequence's fixed state beside its blocks
        max_seqs = min(max_seqs, max(0, usable) // (seq_bytes_gpu + state_gpu))

    def step_s(num_seqs: int) -> float:
        kv_read = num_seqs * (seq_bytes_gpu + 2 * state_gpu)     # a state: read + written
        return capacity.decode_step_s(weight_bytes_gpu, kv_read, gpu.memory_bandwidth_bytes_per_s)

    resident = capacity.resident_tokens_per_seq(context_tokens, kv.policy, window, num_layers=c.num_layers)
    memory_ctx = capacity.max_context_tokens(   # the pool less the sequences' states
        kv.codec.num_blocks_in(usable - concurrency * state_gpu, geom_gpu, capacity.COMPUTE_DTYPE),
        concurrency, block_size, kv.policy, window, num_layers=c.num_layers,
        per_layer_tables=per_layer, windows=windows if per_layer else None)
    return CapacityPlan(
        model=c.name, gpu=gpu.name, num_gpus=num_gpus, kv_spec=kv.spec, block_size=block_size,
        weights_format=weights.strip().lower(), context_tokens=context_tokens, concurrency=concurrency,
        kv_bytes_per_token=bytes_per_token, num_kv_heads_per_gpu=heads_per_gpu,
        kv_bytes_per_block_per_gpu=block_bytes_gpu, resident_tokens_per_seq=resident,
        blocks_per_seq=blocks_per_seq, kv_bytes_per_seq=seq_bytes_gpu * num_gpus + state_all,
        weight_bytes=all_weight_bytes, weight_bytes_per_gpu=weight_bytes_gpu,
        memory_bytes_per_gpu=gpu.memory_bytes, usable_kv_bytes_per_gpu=usable,
        num_blocks_per_gpu=num_blocks, max_concurrent_seqs=max_seqs,
        max_context_tokens=memory_ctx, model_max_context_tokens=c.max_position_embeddings,
        decode_step_s=step_s(concurrency),
        decode_step_s_at_max_seqs=step_s(max_seqs) if max_seqs else math.nan,
        notes=_notes(model, kv, num_gpus, context_tokens, resident, usable)
        + context_limit_notes(memory_ctx, concurrency, c.max_position_embeddings)
        + layout_notes(layout, num_gpus) + _kind_notes(geom_model, kv, per_layer, has_tiers),
        layer_tables="per-layer" if per_layer else "shared", layer_blocks_per_seq=layer_blocks,
        layer_kinds=layer_kind_figures(layout, kv, context_tokens, block_size, per_layer),
        state_bytes_per_seq=state_all)


def _check_concurrency(concurrency) -> None:
    if not isinstance(concurrency, int) or concurrency <= 0:
        raise ValueError(f"concurrency={concurrency!r} must be a positive integer")


def _kind_notes(geom: KVGeometry, kv: KVConfig, per_layer: bool,
                has_tiers: bool) -> tuple[str, ...]:
    """What the spec leaves alone on a hybrid model's sliding layers (the engine's words)."""
    return tuple(layer_kind_notes(geom, kv.policy, per_layer, per_layer_tables_blocker(
        kv.codec, geom, capacity.COMPUTE_DTYPE, has_tiers, kv.window_layout)))


def _notes(model: PlanModel, kv: KVConfig, num_gpus: int, context_tokens: int,
           resident_tokens: int, usable_kv_bytes: int) -> tuple[str, ...]:
    c, notes = model.config, []
    if usable_kv_bytes <= 0:
        notes.append("the weights and the reserve do not fit in this GPU memory: no KV room")
    if c.sliding_window and c.sliding_layers is None and context_tokens > c.sliding_window:
        notes.append(f"resident tokens capped by the model's {c.sliding_window}-token sliding "
                     "window, assuming blocks that slide out are freed (vLLM v1 does)")
    if kv.policy is not None and resident_tokens < context_tokens:
        notes.append(f"policy {kv.policy.name!r} keeps "
                     f"{resident_tokens} of {context_tokens} tokens after it compresses; a "
                     "prompt in prefill may briefly hold all of its tokens")
    if context_tokens > c.max_position_embeddings:
        notes.append(f"context {context_tokens} exceeds the model's trained "
                     f"max_position_embeddings={c.max_position_embeddings}")
    if num_gpus > c.num_kv_heads:
        notes.append(f"{num_gpus} GPUs > {c.num_kv_heads} KV heads: KV heads are replicated")
    if model.num_experts > 1:
        notes.append(f"mixture of experts: weights hold all {model.num_experts} experts "
                     f"({model.num_experts_per_tok} active per token); KV is the attention's")
    return tuple(notes)
