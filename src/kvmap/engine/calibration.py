"""Collect the K and V a model really writes to its cache, for static-scale calibration.

Runs teacher-forced prefill over calibration text with a recording codec wrapped around
the engine's own: every ``write`` is passed through unchanged and its (k, v) kept per
layer -- exactly the post-RoPE values the cache stores, in the compute dtype. The
ranges are then computed by ``kvmap.kv.codecs.calibrate``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from kvmap.kv.codecs.calibrate import calibrate


class _Recorder:
    """Forwards to the wrapped codec; records writes by the LayerStore they go to."""

    def __init__(self, codec, layer_ids: dict[int, int]):
        self.codec = codec
        self.layer_ids = layer_ids
        self.samples: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def write(self, store, slot_ids, k, v):
        layer = self.layer_ids[id(store)]
        self.samples.setdefault(layer, []).append((k.detach().float().cpu(),
                                                   v.detach().float().cpu()))
        return self.codec.write(store, slot_ids, k, v)

    def __getattr__(self, name):
        return getattr(self.codec, name)


def collect_kv_samples(llm, token_chunks: list[list[int]]) -> list[tuple[torch.Tensor,
                                                                         torch.Tensor]]:
    """Per layer (k, v), each (T, H, D) fp32, over all ``token_chunks`` (prefilled one by
    one through ``llm.engine.score``)."""
    engine = llm.engine
    kv = engine.kv
    recorder = _Recorder(kv.codec, {id(store): i for i, store in enumerate(kv.layers)})
    kv.codec = recorder
    try:
        for ids in token_chunks:
            engine.score(ids)
    finally:
        kv.codec = recorder.codec
    return [(torch.cat([k for k, _ in recorder.samples[i]]),
             torch.cat([v for _, v in recorder.samples[i]]))
            for i in range(len(kv.layers))]


def calibrate_model(llm, token_chunks: list[list[int]], path: str | Path,
                    clip: float = 0.0) -> Path:
    """Collect samples and write the static-range file; returns its path."""
    return calibrate(collect_kv_samples(llm, token_chunks), path, clip=clip)
