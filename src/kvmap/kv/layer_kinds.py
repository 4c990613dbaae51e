"""What a KV configuration does on each kind of layer of a hybrid model (sliding-window
layers beside global ones), said once for the engine, the planner and the report.

- A codec acts on every layer alike: the same bytes per token on both kinds.
- A selection policy acts on the global layers only. A sliding layer already holds at
  most its window, and within it a policy is a no-op: the engine keeps the sliding
  layers' most recent tokens (their window) whatever the policy scores, so no saving
  is counted there. A budget smaller than the window would cut the sliding layers to
  the budget; that is said too.
- Sliding layers release what slides out of the window only with per-layer block tables
  (``kvmap.kv.layer_pool``); a codec with per-layer state or tiers keep them whole,
  masked.

These are warnings, not failures: the configuration runs, and the notes name the
layers each part leaves alone.
"""
from __future__ import annotations

import warnings

from kvmap.kv.layer_pool import per_layer_tables_blocker
from kvmap.kv.spec import KVGeometry


def layer_ranges(layers) -> str:
    """``[0, 1, 2, 4, 6, 7]`` -> ``"0-2, 4, 6-7"``."""
    layers, out = sorted(layers), []
    i = 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ", ".join(out)


def layer_kind_notes(geom: KVGeometry, policy, per_layer_tables: bool,
                     blocker: str | None = None) -> list[str]:
    """Sentences on what the configuration does per layer kind; [] for a model whose
    layers are all global."""
    sliding = geom.sliding_layers
    if not sliding:
        return []
    windows = sorted({geom.windows[i] for i in sliding})
    window = "/".join(str(w) for w in windows)
    notes = []
    if not per_layer_tables:
        notes.append(f"sliding layers {layer_ranges(sliding)} keep their whole context "
                     f"resident (masked to the {window}-token window): {blocker or 'shared block table'}")
    if policy is not None:
        notes.append(f"{policy!r} acts on the global layers {layer_ranges(geom.global_layers)} "
                     f"only; it leaves the sliding layers {layer_ranges(sliding)} alone "
                     f"(each keeps its last {window} tokens: a no-op inside the window, no "
                     f"saving counted); a budget under the window cuts them to the budget")
    return notes


def warn_layer_kinds(geom: KVGeometry, kv_config, per_layer_tables: bool, codec,
                     compute_dtype, has_tiers: bool) -> list[str]:
    """Warn (``UserWarning``) with ``layer_kind_notes``; returns them."""
    blocker = per_layer_tables_blocker(codec, geom, compute_dtype, has_tiers,
                                       kv_config.window_layout)
    notes = layer_kind_notes(geom, kv_config.policy, per_layer_tables, blocker)
    for note in notes:
        warnings.warn(f"KV spec {kv_config.spec!r}: {note}", stacklevel=3)
    return notes


# ---- the layer-kind model of a model's KV ------------------------------------------------
#
# Every layer of a decoder keeps one of six kinds of memory across decode steps. Per layer
# and per sequence at a context of ``c`` tokens (``bs`` tokens a block):
#
#   kind      stores per token                 resident tokens      read per decode step
#   global    K+V: 2 x kv_heads x head_dim     c                    c tokens
#   sliding   K+V, as global                   min(c, window)       min(c, window) tokens
#   chunked   K+V, as global                   up to chunk          (c - 1) % chunk + 1 tokens
#   mla       one latent: kv_lora_rank + rope  c                    c tokens (of the latent)
#   linear    nothing per token: a fixed state per sequence         the state, read + written
#   shared    nothing: it reads another layer's K+V                 (counted at that layer)
#
# A chunked layer holds its current chunk, at most ``chunk`` tokens (its peak, which the
# planner sizes for). An MLA latent is one vector per token shared by every head, so tensor
# parallelism replicates it on every GPU rather than splitting it by heads.


class LayerKind:
    """One kind of layer of a model: the layers of that kind and the shape of what each
    holds. Subclasses override what differs; every figure is per layer, per sequence."""

    name = "global"
    codec = "quantizes K and V like every layer: the codec's bytes per token"
    policy = "acts: keeps what it selects of the context"
    tiers = "its blocks move between tiers like any paged block"
    paged = True

    def __init__(self, layers: tuple[int, ...], num_kv_heads: int = 1, head_dim: int = 1):
        if not layers:
            raise ValueError(f"a {self.name} layer kind needs at least one layer")
        self.layers, self.num_kv_heads, self.head_dim = tuple(layers), num_kv_heads, head_dim

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def pool_geometry(self, block_size: int) -> KVGeometry | None:
        """One layer of this kind as a K+V geometry the codecs size (None: no tokens)."""
        return KVGeometry(1, self.num_kv_heads, self.head_dim, block_size)

    def resident_tokens(self, context_tokens: int) -> int:
        """Tokens one layer holds for a sequence of ``context_tokens`` (before a policy)."""
        return context_tokens

    def decode_read_tokens(self, context_tokens: int) -> int:
        """Tokens one decode step reads in one layer."""
        return self.resident_tokens(context_tokens)

    def state_values_per_seq(self) -> int:
        """Values of a fixed per-sequence state (a linear-attention / SSM layer)."""
        return 0

    def window_tokens(self) -> int | None:
        return None

    def describe(self) -> dict:
        return {"kind": self.name, "layers": list(self.layers),
                "num_layers": self.num_layers, "window": self.window_tokens(),
                "codec": self.codec, "policy": self.policy, "tiers": self.tiers}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_layers} layers)"


class GlobalAttention(LayerKind):
    """Full causal attention (Llama, Qwen3, the global layers of Gemma 3 / GPT-OSS)."""


class SlidingWindow(LayerKind):
    """Attention over the last ``window`` tokens (Gemma 2/3, GPT-OSS, Mistral v0.1)."""

    name = "sliding"
    codec = ("quantizes K and V as on a global layer; a codec with per-layer state (KIVI, "
             "static scales) keeps the layer's whole context, masked to the window")
    policy = "moot inside the window (the window is kept whatever the policy scores)"
    tiers = ("with tiers the layer keeps its whole context (one shared block table, masked "
             "to the window); without, only the window's blocks are live")

    def __init__(self, layers, num_kv_heads: int, head_dim: int, window: int):
        super().__init__(layers, num_kv_heads, head_dim)
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"sliding window={window!r} must be a positive number of tokens")
        self.window = window

    def resident_tokens(self, context_tokens: int) -> int:
        return min(context_tokens, self.window)

    def window_tokens(self) -> int | None:
        return self.window


class ChunkedLocal(SlidingWindow):
    """Attention inside fixed chunks of ``window`` tokens (Llama 4's
    ``attention_chunk_size``): a token sees its own chunk only."""

    name = "chunked"
    policy = "moot inside the chunk (the chunk is kept whatever the policy scores)"
    tiers = "only the current chunk's blocks are live (planned; kvmap's engine runs no chunked model)"

    def resident_tokens(self, context_tokens: int) -> int:
        return min(context_tokens, self.window)          # its peak, at a chunk's end

    def decode_read_tokens(self, context_tokens: int) -> int:
        return (context_tokens - 1) % self.window + 1


class MLALatent(LayerKind):
    """Multi-head latent attention (DeepSeek V2/V3, Kimi K2): one compressed latent of
    ``kv_lora_rank`` values plus a shared RoPE key of ``rope_dim`` per token, for every
    head; sized as one K+V "head" of (kv_lora_rank + rope_dim) / 2 values each."""

    name = "mla"
    codec = "quantizes the latent (+ rope key) per token: the codec's bytes per value"
    tiers = "its latent blocks move between tiers like any paged block; replicated per GPU"

    def __init__(self, layers, kv_lora_rank: int, rope_dim: int):
        if (kv_lora_rank + rope_dim) % 2:
            raise ValueError(f"kv_lora_rank={kv_lora_rank} + rope_dim={rope_dim} must be even")
        super().__init__(layers, 1, (kv_lora_rank + rope_dim) // 2)
        self.kv_lora_rank, self.rope_dim = kv_lora_rank, rope_dim


class LinearState(LayerKind):
    """A linear-attention / SSM layer (Qwen3-Next's gated DeltaNet, Mamba): a fixed
    state of ``state_values`` values per sequence (recurrent matrix + conv window),
    whatever the context."""

    name = "linear"
    codec = "none: the state is kept in the compute dtype (a KV codec does not apply)"
    policy = "none: there are no tokens to select"
    tiers = "not paged: the state moves whole with its sequence (swap), never by block"
    paged = False

    def __init__(self, layers, state_values: int):
        super().__init__(layers)
        if not isinstance(state_values, int) or state_values <= 0:
            raise ValueError(f"linear state_values={state_values!r} must be positive")
        self.state_values = state_values

    def pool_geometry(self, block_size: int) -> KVGeometry | None:
        return None

    def resident_tokens(self, context_tokens: int) -> int:
        return 0

    def state_values_per_seq(self) -> int:
        return self.state_values


class SharedKV(LayerKind):
    """A layer that attends with an earlier layer's K and V (Gemma 3n's KV-shared
    layers, YOCO / cross-layer attention): it stores nothing of its own."""

    name = "shared"
    codec = "none of its own: it reads its source layer's (encoded) K and V"
    policy = "follows its source layer"
    tiers = "none of its own"
    paged = False

    def pool_geometry(self, block_size: int) -> KVGeometry | None:
        return None

    def resident_tokens(self, context_tokens: int) -> int:
        return 0

    def decode_read_tokens(self, context_tokens: int) -> int:
        return 0


LAYER_KINDS: dict[str, type[LayerKind]] = {k.name: k for k in (
    GlobalAttention, SlidingWindow, ChunkedLocal, MLALatent, LinearState, SharedKV)}


class KVLayout:
    """A model's layers by kind, each layer in exactly one kind. ``state_bytes_per_value``:
    the dtype of a linear layer's state (the compute dtype, bf16, by default)."""

    def __init__(self, kinds: tuple[LayerKind, ...], num_layers: int,
                 state_bytes_per_value: int = 2):
        seen = sorted(i for k in kinds for i in k.layers)
        if seen != list(range(num_layers)):
            raise ValueError(f"layer kinds {kinds!r} do not cover layers 0..{num_layers - 1} "
                             "exactly once")
        self.kinds, self.num_layers = tuple(kinds), num_layers
        self.state_bytes_per_value = state_bytes_per_value

    @classmethod
    def of_config(cls, model_config) -> "KVLayout":
        """Global and sliding layers of a Llama-shaped ``ModelConfig`` (Gemma 3's hybrid
        pattern, or a window on every layer as Mistral v0.1)."""
        c = model_config
        windows = c.layer_windows
        glob = tuple(i for i, w in enumerate(windows) if w is None)
        slide = tuple(i for i, w in enumerate(windows) if w is not None)
        kinds = ((GlobalAttention(glob, c.num_kv_heads, c.head_dim),) if glob else ()) + (
            (SlidingWindow(slide, c.num_kv_heads, c.head_dim, c.sliding_window),)
            if slide else ())
        return cls(kinds, c.num_layers)

    def kind(self, name: str) -> LayerKind | None:
        return next((k for k in self.kinds if k.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.kinds)

    def state_bytes_per_seq(self) -> int:
        """Bytes of every linear layer's fixed state for one sequence."""
        return sum(k.num_layers * k.state_values_per_seq() for k in self.kinds) \
            * self.state_bytes_per_value

    def __repr__(self) -> str:
        return f"KVLayout({', '.join(map(repr, self.kinds))})"


class LayerKindPeak:
    """Resident bytes per layer kind of a hybrid model's cache at its peak: sampled
    whenever a block becomes used (``pool.on_used``) and the pool's layer blocks reach a
    new high, so the split is the one of the moment the pool peaked (before the sliding
    layers release what slid out, as ``peak_num_used_layer_blocks`` counts). ``by_kind``
    stays {} for a model whose layers are all global.

        with LayerKindPeak(llm.engine.kv) as peak:
            ...
        peak.by_kind      # {"global": bytes, "sliding": bytes}
    """

    def __init__(self, kv_cache):
        self.kv, self.by_kind, self._high = kv_cache, {}, -1

    def _used(self) -> int:
        pool = self.kv.pool
        return pool.num_used_layer_blocks if getattr(self.kv, "per_layer_tables", False) \
            else pool.num_used

    def sample(self) -> None:
        used = self._used()
        if used >= self._high:
            self._high = used
            self.by_kind = {kind: info["resident_bytes"]
                            for kind, info in self.kv.layer_kinds_usage().items()}

    def __enter__(self) -> "LayerKindPeak":
        if self.kv.geom.sliding_layers:
            self.sample()
            self.kv.pool.on_used.append(self.sample)
        return self

    def __exit__(self, *exc) -> None:
        if self.kv.geom.sliding_layers:
            self.kv.pool.on_used.remove(self.sample)
