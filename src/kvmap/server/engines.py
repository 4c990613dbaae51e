"""Build the engines of a server: the model is loaded once, and each KV configuration
gets its own ``Engine`` (own paged pool, scheduler, prefix cache) over the same weights.

``kvmap.config.EngineArgs`` holds what ``kvmap serve`` takes on the command line;
``make_engine_factory`` returns the first engine and a factory ``kv spec -> Engine``
for the adaptive controller's later switches. Every engine gets the same
``kv_memory`` budget (bytes, or the model's bf16 tokens), so a compressed configuration
gets more blocks (that is the point of switching to it under load).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from kvmap.config import DTYPES, EngineArgs
from kvmap.engine.engine import Engine
from kvmap.kv.config import KVConfig
from kvmap.model.byte_tokenizer import ByteTokenizer


def make_engine_factory(config: EngineArgs, kv: str):
    """-> (first engine with KV spec ``kv``, factory ``spec -> Engine`` sharing its model).

    A model without a tokenizer (``dummy:*``) gets the ``ByteTokenizer``."""
    from kvmap.model.loader import load_model      # heavy imports only when serving
    config = replace(config, kv=kv).resolved()     # dtype/kv "auto": this machine's
    dtype = config.dtype
    kv_config = KVConfig.parse(config.kv, dtype)   # a bad spec fails before loading weights
    engine_config = config.engine_config()
    loaded = load_model(config.model, getattr(torch, DTYPES[dtype]), config.device,
                        quantization=config.quantization)
    if loaded.tokenizer is None:
        loaded.tokenizer = ByteTokenizer.for_model(loaded.config)
    first = Engine(engine_config, loaded, kv_config)

    def factory(spec: str, **scheduler_overrides: int) -> Engine:
        """A new engine for ``spec``; ``scheduler_overrides``: an adaptive level's own
        ``max_num_seqs`` / ``max_num_batched_tokens``."""
        scheduler = replace(engine_config.scheduler, **scheduler_overrides)
        spec = dtype if spec.strip() == "auto" else spec
        return Engine(replace(engine_config, kv=spec, scheduler=scheduler), loaded,
                      KVConfig.parse(spec, dtype), model=first.model)

    return first, factory


def check_kv_specs(first: Engine, specs: list[str]) -> None:
    """Fail at start-up, not at the first switch: every spec parses and its codec fits
    the model's geometry."""
    for spec in specs:
        codec = KVConfig.parse(spec, first.config.dtype).codec
        codec.validate_geometry(first.geom)
