"""Build the engines of a server: the model is loaded once, and each KV configuration
gets its own ``Engine`` (own paged pool, scheduler, prefix cache) over the same weights.

``kvmap.config.EngineArgs`` holds what ``kvmap serve`` takes on the command line;
``make_engine_factory`` returns the first engine and a factory ``kv spec -> Engine``
for the adaptive controller's later switches, all built by
``kvmap.engine.builder.build_engine``. Every engine gets the same
``kv_memory`` budget (bytes, or the model's bf16 tokens), so a compressed configuration
gets more blocks (that is the point of switching to it under load).
"""
from __future__ import annotations

from dataclasses import replace

from kvmap.config import EngineArgs
from kvmap.engine.builder import build_engine
from kvmap.engine.engine import Engine
from kvmap.kv.config import KVConfig


def make_engine_factory(config: EngineArgs):
    """-> (first engine, of ``config.kv``; factory ``spec -> Engine`` sharing its model).

    A model without a tokenizer (``dummy:*``) gets the ``ByteTokenizer``."""
    config = config.resolved()               # dtype/kv "auto", device: this machine's
    first = build_engine(config, byte_tokenizer=True)

    def factory(spec: str, **scheduler_overrides: int) -> Engine:
        """A new engine for ``spec``; ``scheduler_overrides``: an adaptive level's own
        ``max_num_seqs`` / ``max_num_batched_tokens``."""
        spec = config.dtype if spec.strip() == "auto" else spec
        return build_engine(replace(config, kv=spec), share_with=first,
                            **scheduler_overrides)

    return first, factory


def check_kv_specs(first: Engine, specs: list[str]) -> None:
    """Fail at start-up, not at the first switch: every spec parses and its codec fits
    the model's geometry."""
    for spec in specs:
        codec = KVConfig.parse(spec, first.config.dtype).codec
        codec.validate_geometry(first.geom)
