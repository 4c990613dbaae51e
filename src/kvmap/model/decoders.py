"""The decoder families kvmap runs, by ``ModelConfig.architecture``: ``DECODERS``.

Each decoder file registers its class (``@DECODERS.register``, under its
``architecture``): ``llama`` (``llama.py``: Llama, Mistral, Qwen2, SmolLM2) and
``gemma3`` (``gemma3.py``); the package's ``__init__`` imports them. A decoder class is
built as ``cls(config, weights, dtype, device, quantization, int4_groups,
calibration_ids)`` and has ``forward(input_ids, positions, meta, kv)``, ``logits``,
``weight_bytes``, ``embed``, ``norm``, ``dtype``, ``device`` and ``quantization``.
"""
from __future__ import annotations

from kvmap.registry import Registry

DECODERS: Registry[type] = Registry("decoder")


def build_decoder(loaded, dtype, device):
    """The decoder of ``loaded`` (a ``loader.LoadedModel``) built from its weights; a
    ValueError names an architecture no decoder implements and the ones that exist."""
    cls = DECODERS.get(loaded.config.architecture)
    return cls(loaded.config, loaded.weights, dtype, device,
               getattr(loaded, "quantization", None), getattr(loaded, "int4_groups", None),
               getattr(loaded, "calibration_ids", None))
