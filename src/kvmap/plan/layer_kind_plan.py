"""Per layer kind of a model (:class:`kvmap.kv.layer_kinds.KVLayout`), what one sequence
holds and reads at a context, under a KV configuration: the planner's ``layer_kinds``.

For a kind of ``n`` layers, ``B`` the codec's bytes of one layer's block of ``bs``
tokens (``codec.block_bytes`` of the kind's K+V shape), ``slots`` the tokens the policy
keeps of ``context`` (all of them without one)::

    bytes_per_token   = n x B / bs                          (0 for linear and shared)
    kv_bytes_per_seq  = n x blocks x B                      paged kinds
                      = n x state_values x state bytes      linear
    blocks            = resident_blocks(context, policy)    global, mla; sliding / chunked
                                                            with a shared block table
                      = layer_resident_blocks(slots, W)     sliding / chunked, per-layer tables
    decode_read_bytes = n x read tokens x B / bs            (linear: its state, read and written)

The figures are one copy of the model's KV (an MLA latent, replicated on every GPU under
tensor parallelism, counted once).
"""
from __future__ import annotations

from kvmap.kv.layer_kinds import KVLayout, LayerKind
from kvmap.kv.spec import layer_resident_blocks
from kvmap.plan import capacity


def layer_block_bytes(kind: LayerKind, codec, block_size: int) -> int:
    """Bytes of one layer's block of ``kind`` in ``codec`` (0: the kind is not paged)."""
    geom = kind.pool_geometry(block_size)
    if geom is None:
        return 0
    codec.validate_geometry(geom)
    return codec.block_bytes(geom, capacity.COMPUTE_DTYPE)


def kind_figures(kind: LayerKind, layout: KVLayout, kv, context_tokens: int,
                 block_size: int, per_layer: bool) -> dict:
    """One kind's entry of ``layer_kinds`` (see the module docstring)."""
    n, bs = kind.num_layers, block_size
    block_bytes = layer_block_bytes(kind, kv.codec, bs)
    slots = capacity.resident_tokens_per_seq(context_tokens, kv.policy,
                                             num_layers=layout.num_layers)
    window = kind.window_tokens()
    if not kind.paged:
        resident, seq_bytes = 0, n * kind.state_values_per_seq() * layout.state_bytes_per_value
        read_bytes = 2 * seq_bytes
    else:
        if window is None or not per_layer:
            blocks = capacity.resident_blocks(context_tokens, bs, kv.policy,
                                              num_layers=layout.num_layers)
        else:
            blocks = layer_resident_blocks(slots, bs, window)
        resident = slots if window is None or not per_layer else min(slots, window - 1)
        seq_bytes = n * blocks * block_bytes
        read_tokens = min(slots, kind.decode_read_tokens(context_tokens))
        read_bytes = round(n * read_tokens * block_bytes / bs)
    return {**kind.describe(), "bytes_per_token": n * block_bytes / bs,
            "resident_tokens_per_seq": resident, "kv_bytes_per_seq": seq_bytes,
            "decode_read_bytes_per_seq": read_bytes}


def layer_kind_figures(layout: KVLayout, kv, context_tokens: int, block_size: int,
                       per_layer: bool) -> dict[str, dict]:
    """``{kind name: figures}`` for every kind of ``layout`` (one entry a kind)."""
    return {k.name: kind_figures(k, layout, kv, context_tokens, block_size, per_layer)
            for k in layout.kinds}


def context_limit_notes(memory_context_tokens: int | None, concurrency: int,
                        model_max_context_tokens: int) -> tuple[str, ...]:
    """A note when the memory would hold a longer context than the model was trained
    for: the figure to plan with is the model's limit (``usable_max_context_tokens``)."""
    if memory_context_tokens is not None and memory_context_tokens <= model_max_context_tokens:
        return ()
    held = "any context" if memory_context_tokens is None else \
        f"{memory_context_tokens:,} tokens ({memory_context_tokens / model_max_context_tokens:,.0f}x)"
    return (f"the memory holds {held} at concurrency {concurrency}, beyond the model's own "
            f"limit max_position_embeddings={model_max_context_tokens:,}: the longest "
            f"usable context is {model_max_context_tokens:,}",)


def layout_notes(layout: KVLayout, num_gpus: int) -> tuple[str, ...]:
    """What the planner assumes of the kinds that are not plain K+V layers."""
    notes = []
    for kind in layout.kinds:
        if kind.name == "chunked":
            notes.append(f"chunked layers {kind.layers[0]}.. hold at most their "
                         f"{kind.window_tokens()}-token chunk: planned at that peak")
        elif kind.name == "mla":
            notes.append("MLA: one latent per token for every head, sized as one K+V head of "
                         f"{kind.head_dim}" + (f"; replicated on each of the {num_gpus} GPUs"
                                              if num_gpus > 1 else ""))
        elif kind.name == "linear":
            notes.append(f"{kind.num_layers} linear-attention layers hold a fixed state of "
                         f"{kind.state_values_per_seq() * layout.state_bytes_per_value:,} "
                         "bytes per sequence each (compute dtype; not paged, no codec)")
    return tuple(notes)
