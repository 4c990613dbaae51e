"""One way from engine settings to a running engine: ``build_engine(args)``.

    EngineArgs --resolved()--> device, dtype, kv concrete for this machine
               --KVConfig.parse--> the spec, parsed once (a bad spec fails before weights)
               --load_model--> weights, tokenizer
               --> Engine

``LLM`` and ``kvmap serve`` (``server/engines.py``) both build their engines here. A
server's later engines share the first one's weights (``share_with``).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from kvmap.config import DTYPES, EngineArgs
from kvmap.engine.engine import Engine
from kvmap.kv.config import KVConfig


def build_engine(args: EngineArgs, *, byte_tokenizer: bool = False,
                 share_with: Engine | None = None, **scheduler_overrides: int) -> Engine:
    """An engine for ``args`` (resolved here unless the caller did: ``EngineArgs.resolved``
    warns once about a dtype the device runs slowly). ``byte_tokenizer``: a
    model without a tokenizer (``dummy:*``) gets the ``ByteTokenizer`` (the server's, so
    that it can take text). ``share_with``: run over that engine's weights (same model,
    dtype and device) instead of loading them; ``scheduler_overrides``:
    ``max_num_seqs`` / ``max_num_batched_tokens`` of this engine alone."""
    args = replace(args, **scheduler_overrides)
    if args.device is None or args.dtype == "auto" or args.kv.strip() == "auto":
        args = args.resolved()
    kv_config = KVConfig.parse(args.kv, args.dtype)
    config = args.engine_config()
    if share_with is not None:
        return Engine(config, share_with.loaded, kv_config, model=share_with.model)
    from kvmap.model.loader import load_model      # heavy imports only when building
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    loaded = load_model(args.model, getattr(torch, DTYPES[args.dtype]), args.device,
                        quantization=args.quantization)
    if byte_tokenizer and loaded.tokenizer is None:
        from kvmap.model.byte_tokenizer import ByteTokenizer
        loaded = replace(loaded, tokenizer=ByteTokenizer.for_model(loaded.config))
    return Engine(config, loaded, kv_config)
