"""How much KV cache fits beside the weights: pure functions and one frozen result.

The cache is counted the way the engine allocates it (``kvmap.kv.cache``): whole blocks of
``block_size`` tokens, each block holding every layer's K and V in the codec's real
storage, scales and zero points included::

    kv_bytes_per_block = codec.block_bytes(geom)      # exact, from a meta-device allocation
                       = block_size * 2 * num_layers * num_kv_heads * head_dim * bytes_per_value
                         (+ scales) for the plain codecs
    blocks_per_seq     = ceil(resident_tokens / block_size)     (+1, see resident_blocks)

With tensor parallelism over ``num_gpus`` GPUs each GPU holds ``num_kv_heads / num_gpus`` KV
heads of every token (at least one: heads are replicated when GPUs outnumber them, as in
vLLM), and its own pool of blocks, sized from what is left of its memory::

    usable_kv_bytes_per_gpu = memory_bytes * gpu_memory_utilization
                              - weight_bytes / num_gpus - reserve_bytes_per_gpu
    num_blocks_per_gpu      = usable_kv_bytes_per_gpu // kv_bytes_per_block_per_gpu
    max_concurrent_seqs     = num_blocks_per_gpu // blocks_per_seq

``gpu_memory_utilization`` defaults to vLLM's 0.9. ``reserve_bytes_per_gpu`` (default 2 GiB)
stands for what vLLM measures by a profiling run and this planner cannot: the activation peak
of a prefill chunk, CUDA graphs, NCCL buffers and allocator slack.
"""
from __future__ import annotations

import math

import torch

from kvmap.kv.layer_pool import wants_per_layer_tables
from kvmap.kv.policies.base import Policy
from kvmap.kv.spec import KVGeometry, layer_resident_blocks

GPU_MEMORY_UTILIZATION = 0.9
RESERVE_BYTES_PER_GPU = 2 * 2**30
COMPUTE_DTYPE = torch.bfloat16          # the dtype K and V are computed in (codecs' input)
UNBOUNDED_TOKENS = 2**40                # a context no memory limit reaches: "unbounded"


def kv_heads_per_gpu(num_kv_heads: int, num_heads: int, num_gpus: int) -> int:
    """KV heads each GPU stores under tensor parallelism; ValueError if the split is uneven."""
    if not isinstance(num_gpus, int) or num_gpus <= 0:
        raise ValueError(f"num_gpus={num_gpus!r} must be a positive integer")
    if num_heads % num_gpus or (num_kv_heads % num_gpus and num_gpus % num_kv_heads):
        raise ValueError(f"num_gpus={num_gpus} does not split {num_heads} attention heads and "
                         f"{num_kv_heads} KV heads evenly (tensor parallelism)")
    return max(1, num_kv_heads // num_gpus)


def per_layer_tables(kv_config, model_config, block_size: int, has_tiers: bool) -> bool:
    """Whether the engine runs ``kv_config`` with per-layer block tables
    (``kvmap.kv.layer_pool.wants_per_layer_tables``: a ``layer_budgets`` policy, by default
    where the codec can share one store and there are no tiers). Those free each layer's
    hole and share no prefix blocks."""
    geom = KVGeometry.of(model_config, block_size)
    return wants_per_layer_tables(kv_config.policy, kv_config.codec, geom, COMPUTE_DTYPE,
                                  has_tiers, kv_config.window_layout)


def window_layout(model_config, block_size: int, per_layer_tables: bool
                  ) -> tuple[int | None, tuple[int | None, ...] | None]:
    """``(window, windows)``: a window on every layer (Mistral v0.1), which caps every
    layer's residency, or a hybrid model's per-layer windows, counted per layer
    (:func:`hybrid_layer_blocks`) when the engine has per-layer tables for them."""
    if model_config.sliding_layers is None:
        return model_config.sliding_window, None
    windows = KVGeometry.of(model_config, block_size).layer_windows
    return None, windows if per_layer_tables else None


def resident_tokens_per_seq(context_tokens: int, policy: Policy | None = None,
                            sliding_window: int | None = None, *,
                            num_layers: int | None = None,
                            num_prompt_tokens: int | None = None) -> int:
    """Tokens of one sequence the cache must hold: what the policy keeps
    (``Policy.resident_tokens``; all of them without one), capped by the model's sliding
    window (tokens that slid out are freed). ``num_layers`` sizes per-layer budgets;
    ``num_prompt_tokens`` is what a fractional budget is a fraction of (the context by
    default; the prompt at decode time, as the engine does)."""
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) \
            or context_tokens <= 0:
        raise ValueError(f"context={context_tokens!r} must be a positive number of tokens")
    kept = context_tokens if policy is None else policy.resident_tokens(
        context_tokens, num_layers=num_layers, num_prompt_tokens=num_prompt_tokens)
    return min(kept, sliding_window) if sliding_window else kept


def resident_blocks(context_tokens: int, block_size: int, policy: Policy | None = None,
                    sliding_window: int | None = None, *, num_layers: int | None = None,
                    num_prompt_tokens: int | None = None) -> int:
    """Blocks one sequence holds. Freeing is by whole blocks, so a trimmed sequence keeps one
    partly-dropped block beside its kept tokens (vLLM's sliding-window rule does the same).
    Block size 4, 17 tokens, 4 sinks + the last 6 kept (10 tokens)::

        tokens  [s s s s|x x x x|x x x k|k k k k|k . . .]   s sink, x dropped, k kept
        blocks   kept    freed   partly  kept    kept      -> ceil(10 / 4) + 1 = 4 blocks
    """
    resident = resident_tokens_per_seq(context_tokens, policy, sliding_window,
                                       num_layers=num_layers,
                                       num_prompt_tokens=num_prompt_tokens)
    num_blocks = math.ceil(resident / block_size)
    if resident < context_tokens:
        num_blocks = min(num_blocks + 1, math.ceil(context_tokens / block_size))
    return num_blocks


def resident_layer_blocks(context_tokens: int, block_size: int, policy: Policy, *,
                          num_layers: int, num_prompt_tokens: int | None = None) -> int:
    """Layer blocks (one layer's ``block_size`` slots each) one sequence holds with
    per-layer block tables (``kvmap.kv.layer_pool``), summed over layers. Once compressed
    to ``n`` slots (the largest layer's share, ``Policy.resident_tokens``), layer l with
    budget ``b_l`` (largest ``B``) keeps the blocks of its tokens and of slot ``B`` and
    frees the blocks wholly inside its hole ``(b_l, B)``::

        held_l = ceil(n / bs) - max(0, floor(B / bs) - ceil(b_l / bs))

    A sequence no longer than ``B`` is never compressed: every layer holds all its
    blocks. Decoding adds up to one block a layer before the next compression."""
    n = resident_tokens_per_seq(context_tokens, policy, num_layers=num_layers,
                                num_prompt_tokens=num_prompt_tokens)
    if n >= context_tokens:
        return num_layers * math.ceil(context_tokens / block_size)
    prompt = context_tokens if num_prompt_tokens is None else num_prompt_tokens
    budgets = policy.layer_budget_tokens(prompt, num_layers)
    top = max(budgets) // block_size
    return sum(math.ceil(n / block_size) - max(0, top - math.ceil(b / block_size))
               for b in budgets)


def hybrid_layer_blocks(context_tokens: int, block_size: int, policy: Policy | None,
                        windows: tuple[int | None, ...], *,
                        num_prompt_tokens: int | None = None) -> int:
    """Layer blocks one sequence of a hybrid model holds with per-layer block tables,
    summed over layers (``kvmap.kv.layer_kinds``): a global layer what the policy keeps
    (``resident_blocks``; all of the context without one), a sliding layer of window W
    the blocks from its first live slot on (``kvmap.kv.spec.layer_resident_blocks``) of
    the slots the sequence holds -- the engine's count once a step is done::

        held = num_global * blocks(context) + sum over sliding layers of
               ceil(n / bs) - floor(max(0, n - W + 1) / bs),   n = slots held

    Gemma 3 270M at 8,192 tokens, bs 16: 3 x 512 + 15 x 32 = 2,016 layer blocks."""
    num_layers = len(windows)
    slots = resident_tokens_per_seq(context_tokens, policy, num_layers=num_layers,
                                    num_prompt_tokens=num_prompt_tokens)
    global_blocks = resident_blocks(context_tokens, block_size, policy,
                                    num_layers=num_layers, num_prompt_tokens=num_prompt_tokens)
    return sum(global_blocks if w is None else layer_resident_blocks(slots, block_size, w)
               for w in windows)


def usable_kv_bytes_per_gpu(memory_bytes: int, weight_bytes_per_gpu: int,
                            gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                            reserve_bytes_per_gpu: int = RESERVE_BYTES_PER_GPU) -> int:
    """Bytes left for the KV pool on one GPU; negative when the weights do not fit."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization!r} must be in (0, 1]")
    return int(memory_bytes * gpu_memory_utilization) - weight_bytes_per_gpu - reserve_bytes_per_gpu


def num_blocks_in(kv_bytes: int, kv_bytes_per_block: int) -> int:
    """Whole blocks a byte budget holds (0 for a non-positive budget)."""
    return max(0, kv_bytes) // kv_bytes_per_block


def max_context_tokens(num_blocks: int, num_seqs: int, block_size: int,
                       policy: Policy | None = None, sliding_window: int | None = None, *,
                       num_layers: int | None = None,
                       per_layer_tables: bool = False,
                       windows: tuple[int | None, ...] | None = None) -> int | None:
    """Largest context each of ``num_seqs`` sequences can have at once in ``num_blocks``
    blocks; None when no context is too long (a policy or window bounds the residency).
    With ``per_layer_tables`` the pool is counted in layer blocks
    (:func:`resident_layer_blocks`, or :func:`hybrid_layer_blocks` with a hybrid
    model's ``windows``)."""
    if not isinstance(num_seqs, int) or num_seqs <= 0:
        raise ValueError(f"concurrency={num_seqs!r} must be a positive integer")

    def fits(context_tokens: int) -> bool:
        if per_layer_tables and windows is not None:
            layer_blocks = hybrid_layer_blocks(context_tokens, block_size, policy, windows)
            return num_seqs * layer_blocks <= num_blocks * len(windows)
        if per_layer_tables:
            layer_blocks = resident_layer_blocks(context_tokens, block_size, policy,
                                                 num_layers=num_layers)
            return num_seqs * layer_blocks <= num_blocks * num_layers
        blocks = resident_blocks(context_tokens, block_size, policy, sliding_window,
                                 num_layers=num_layers)
        return num_seqs * blocks <= num_blocks

    if fits(UNBOUNDED_TOKENS):
        return None
    lo, hi = 0, UNBOUNDED_TOKENS        # fits(lo) (or lo == 0), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def decode_step_s(weight_bytes_per_gpu: int, kv_bytes_read_per_gpu: int,
                  memory_bandwidth_bytes_per_s: float) -> float:
    """Memory-bound lower bound of one decode step: every GPU reads its weights (an MoE all
    its experts, as at any batch of more than a few sequences) and the batch's KV once.
    Compute, communication and kernel overheads are ignored."""
    return (weight_bytes_per_gpu + kv_bytes_read_per_gpu) / memory_bandwidth_bytes_per_s

