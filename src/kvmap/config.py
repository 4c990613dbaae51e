"""Frozen configuration dataclasses, validated on construction.

Every caller error raises ``ValueError`` naming the bad field and value.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from kvmap.hardware.dtype import DTYPES, canonical_dtype, check_dtype  # noqa: F401 (re-export)

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}


def parse_size(value: str | int | float, what: str = "size") -> int:
    """Parse ``"256MiB"``, ``"2GB"``, ``"1.5g"`` or a plain byte count into bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{what}={value!r} is not a byte size")
    if isinstance(value, (int, float)):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{what}={value!r} must be a non-negative byte count")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(
            f"{what}={value!r} is not a byte size (examples: 256MiB, 2GB, 1048576)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def format_bytes(num_bytes: float) -> str:
    """Human form with binary units: 23040 -> '22.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num_bytes) < 1024 or unit == "TiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder (Llama, Mistral, Qwen2 style)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False          # Qwen2 has a bias on q/k/v projections
    sliding_window: int | None = None      # Mistral-style local attention, in tokens
    rope_scaling: dict | None = None       # Llama-3.1 style {"rope_type": "llama3", ...}
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # the decoder that runs it (kvmap.model.DECODERS): "llama" or "gemma3"
    architecture: str = "llama"
    # layers that attend through ``sliding_window`` (Gemma 3: five of every six); None:
    # every layer when ``sliding_window`` is set (Mistral v0.1)
    sliding_layers: tuple[int, ...] | None = None
    rope_local_theta: float | None = None      # RoPE base of the sliding layers (Gemma 3)
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2; None: head_dim

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name}={value!r} must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int)
                                                or self.sliding_window < 1):
            raise ValueError(f"ModelConfig.sliding_window={self.sliding_window!r} must be a "
                             f"positive integer or None")
        if self.sliding_layers is not None:
            if self.sliding_window is None:
                raise ValueError(f"ModelConfig.sliding_layers={self.sliding_layers!r} needs "
                                 f"a sliding_window")
            bad = [i for i in self.sliding_layers if not 0 <= i < self.num_layers]
            if bad:
                raise ValueError(f"ModelConfig.sliding_layers has layer {bad[0]}, outside "
                                 f"0..{self.num_layers - 1}")

    @classmethod
    def from_dict(cls, fields: dict) -> "ModelConfig":
        """The inverse of ``dataclasses.asdict`` through JSON (lists back to tuples)."""
        fields = dict(fields)
        fields["eos_token_ids"] = tuple(fields.get("eos_token_ids", ()))
        if fields.get("sliding_layers") is not None:
            fields["sliding_layers"] = tuple(fields["sliding_layers"])
        return cls(**fields)

    def layer_window(self, layer: int) -> int | None:
        """Tokens layer ``layer`` attends to (itself included), None for a global layer."""
        if self.sliding_window is None:
            return None
        if self.sliding_layers is None or layer in self.sliding_layers:
            return self.sliding_window
        return None

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """``layer_window`` of every layer."""
        return tuple(self.layer_window(i) for i in range(self.num_layers))

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        if self.architecture == "gemma3":     # pre/post FFN norms, q and k norms
            per_layer += 2 * h + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * per_layer + h + head


_TOKENS = re.compile(r"\s*([0-9]+)\s*tokens?\s*", re.IGNORECASE)
DEFAULT_KV_MEMORY = "256MiB"          # the KV pool budget when none is given


def parse_kv_memory(value: str | int | float) -> tuple[int | None, int | None]:
    """A KV pool budget -> ``(bytes, None)`` for a byte size (``"256MiB"``, 1048576) or
    ``(None, tokens)`` for a capacity in the model's bf16 tokens (``"3072 tokens"``).

    A token budget is the same bytes for every KV configuration (tokens x the model's
    bf16 bytes per token), so a codec with half the bytes per token holds twice the
    tokens; the engine turns it into bytes once the model's geometry is known."""
    if isinstance(value, str):
        m = _TOKENS.fullmatch(value)
        if m:
            tokens = int(m.group(1))
            if tokens < 1:
                raise ValueError(f"kv_memory={value!r} must be at least 1 token")
            return None, tokens
        if "token" in value.lower():
            raise ValueError(f"kv_memory={value!r} is not a token budget (example: "
                             "'3072 tokens')")
    try:
        return parse_size(value, "kv_memory"), None
    except ValueError:
        raise ValueError(f"kv_memory={value!r} is neither a byte size (256MiB, 2GB, "
                         "1048576) nor a token budget ('3072 tokens')") from None


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV pool sizing: a byte budget, a budget in the model's bf16 tokens
    (``kv_memory_tokens``, turned into bytes by the engine) or an explicit block count."""

    block_size: int = 16
    kv_memory_bytes: int | None = parse_size(DEFAULT_KV_MEMORY)
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    kv_memory_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or not 1 <= self.block_size <= 1024:
            raise ValueError(f"block_size={self.block_size!r} must be an integer in [1, 1024]")
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int)
                                            or self.num_blocks <= 0):
            raise ValueError(f"num_blocks={self.num_blocks!r} must be a positive integer")
        if self.kv_memory_bytes is not None and self.kv_memory_bytes <= 0:
            raise ValueError(f"kv_memory={self.kv_memory_bytes!r} bytes must be positive")
        if self.kv_memory_tokens is not None and self.kv_memory_tokens <= 0:
            raise ValueError(f"kv_memory={self.kv_memory_tokens!r} tokens must be positive")
        if self.num_blocks is None and self.kv_memory_bytes is None \
                and self.kv_memory_tokens is None:
            raise ValueError("give either kv_memory or num_blocks")


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits per engine step."""

    max_num_seqs: int = 64                 # running sequences at once
    max_num_batched_tokens: int = 512      # token budget of one step (prefill chunks + decodes)
    chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs={self.max_num_seqs!r} must be positive")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens!r} must be positive")


@dataclass(frozen=True)
class EngineConfig:
    """What the engine runs: every field concrete (``dtype`` is never ``auto`` here)."""

    model: str = "smollm2"
    dtype: str = "fp32"
    device: str = "cpu"
    kv: str = "fp32"
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    num_threads: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_dtype(self.dtype, allow_auto=False)


def _setting(default, help: str):
    """An ``EngineArgs`` field: its default and its command-line help."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class EngineArgs:
    """Every engine setting a user gives, declared here once (as vLLM's ``EngineArgs``):
    ``LLM(**kwargs)``, the bench's scenario ``engine:`` section, ``kvmap generate``,
    ``eval`` and ``serve`` (their options come from these fields' defaults and help:
    ``kvmap.cli_options``) all build one; ``kvmap.engine.build.build_engine`` builds the
    engine from it, through ``engine_config()``.

    ``kv_memory``: a byte size (``"256MiB"``) or a budget in the model's bf16 tokens
    (``"3072 tokens"``); ``num_blocks`` overrides it (tests). ``device=None``: CUDA when
    available, else the CPU; ``model=None``: the embedded SmolLM2-135M. ``dtype="auto"``:
    the fastest exact compute dtype of the device (``kvmap.hardware``); ``kv="auto"``: the
    compute dtype's own cache. :meth:`resolved` makes all three concrete."""

    model: str | None = _setting(None, "GGUF path, HF dir, dummy:<shape>; default: "
                                       "embedded SmolLM2-135M.")
    dtype: str = _setting("auto", "auto | fp32 | bf16 | fp16 (auto: the fastest exact "
                                  "dtype here, `kvmap hw`)")
    kv: str = _setting("auto", "KV spec, e.g. 'int8(granularity=token)' (auto: the "
                               "compute dtype's own cache)")
    kv_memory: str | int = _setting(DEFAULT_KV_MEMORY, "KV pool budget: bytes (256MiB) or "
                                                       "the model's bf16 tokens ('3072 tokens')")
    num_blocks: int | None = _setting(None, "KV pool blocks (overrides kv_memory)")
    block_size: int = _setting(16, "Token slots per KV block")
    max_num_seqs: int = _setting(64, "Running sequences at once")
    max_num_batched_tokens: int = _setting(512, "Token budget of one step")
    enable_prefix_caching: bool = _setting(True, "Reuse cached prefix blocks")
    num_threads: int | None = _setting(None, "Torch CPU threads (default: torch's)")
    device: str | None = _setting(None, "cpu | cuda (default: cuda when available)")
    seed: int = _setting(0, "Sampling seed")
    quantization: str | None = _setting(None, "Weights: int8 | w8a8 | int4 "
                                              "(kvmap.model.wquant)")

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if self.num_blocks is None:
            parse_kv_memory(self.kv_memory)

    def cache_config(self) -> CacheConfig:
        if self.num_blocks:
            return CacheConfig(self.block_size, None, self.num_blocks,
                               self.enable_prefix_caching)
        num_bytes, num_tokens = parse_kv_memory(self.kv_memory)
        return CacheConfig(self.block_size, num_bytes, None, self.enable_prefix_caching,
                           kv_memory_tokens=num_tokens)

    def resolved(self) -> "EngineArgs":
        """A copy with ``device``, ``dtype`` and a bare ``kv="auto"`` made concrete for
        this machine (``kvmap.hardware.resolve_dtype``: an explicit dtype the device
        cannot run is refused here, before any weight is loaded)."""
        import torch
        from kvmap.hardware import resolve_dtype
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = resolve_dtype(self.dtype, device)
        kv = dtype if self.kv.strip() == "auto" else self.kv
        return replace(self, device=device, dtype=dtype, kv=kv)

    def engine_config(self, device: str | None = None) -> EngineConfig:
        """The engine's config (``device`` overrides this one's), every field resolved."""
        args = replace(self, device=device or self.device).resolved()
        return EngineConfig(model=args.model or "smollm2", dtype=args.dtype,
                            device=args.device, kv=args.kv, cache=args.cache_config(),
                            scheduler=SchedulerConfig(args.max_num_seqs,
                                                      args.max_num_batched_tokens),
                            num_threads=args.num_threads, seed=args.seed)
