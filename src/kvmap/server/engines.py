"""Build the engines of a server: the model is loaded once, and each KV configuration
gets its own ``Engine`` (own paged pool, scheduler, prefix cache) over the same weights.

``ServerEngineConfig`` holds what ``kvmap serve`` takes on the command line;
``make_engine_factory`` returns the first engine and a factory ``kv spec -> Engine``
for the adaptive controller's later switches. Every engine gets the same
``kv_memory`` byte budget, so a compressed configuration gets more blocks (that is the
point of switching to it under load).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kvmap.config import DTYPES, CacheConfig, EngineConfig, SchedulerConfig, parse_size
from kvmap.engine.engine import Engine
from kvmap.kv.config import KVConfig
from kvmap.model.byte_tokenizer import ByteTokenizer


@dataclass(frozen=True)
class ServerEngineConfig:
    model: str | None = None              # None: the embedded SmolLM2-135M
    dtype: str = "bf16"
    kv_memory: str | int = "256MiB"
    num_blocks: int | None = None         # overrides kv_memory (tests)
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    device: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not one of {sorted(DTYPES)}")


def make_engine_factory(config: ServerEngineConfig, kv: str):
    """-> (first engine with KV spec ``kv``, factory ``spec -> Engine`` sharing its model).

    A model without a tokenizer (``dummy:*``) gets the ``ByteTokenizer``."""
    from kvmap.model.loader import load_model      # heavy imports only when serving
    kv_config = KVConfig.parse(kv)                 # a bad spec fails before loading weights
    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cache = CacheConfig(block_size=config.block_size,
                        kv_memory_bytes=None if config.num_blocks
                        else parse_size(config.kv_memory, "kv_memory"),
                        num_blocks=config.num_blocks,
                        enable_prefix_caching=config.enable_prefix_caching)
    engine_config = EngineConfig(model=config.model or "smollm2", dtype=config.dtype,
                                 device=device, kv=kv, cache=cache,
                                 scheduler=SchedulerConfig(config.max_num_seqs,
                                                           config.max_num_batched_tokens),
                                 seed=config.seed)
    loaded = load_model(config.model, getattr(torch, DTYPES[config.dtype]), device)
    if loaded.tokenizer is None:
        loaded.tokenizer = ByteTokenizer.for_model(loaded.config)
    first = Engine(engine_config, loaded, kv_config)

    def factory(spec: str, **scheduler_overrides: int) -> Engine:
        """A new engine for ``spec``; ``scheduler_overrides``: an adaptive level's own
        ``max_num_seqs`` / ``max_num_batched_tokens``."""
        scheduler = replace(engine_config.scheduler, **scheduler_overrides)
        return Engine(replace(engine_config, kv=spec, scheduler=scheduler), loaded,
                      KVConfig.parse(spec), model=first.model)

    return first, factory


def check_kv_specs(first: Engine, specs: list[str]) -> None:
    """Fail at start-up, not at the first switch: every spec parses and its codec fits
    the model's geometry."""
    for spec in specs:
        codec = KVConfig.parse(spec).codec
        codec.validate_geometry(first.geom)
