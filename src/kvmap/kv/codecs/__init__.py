"""Codec registry: spec-string name -> Codec class. One file per codec family."""
from __future__ import annotations

from kvmap.kv.codecs.base import Codec, LayerStore
from kvmap.kv.codecs.none import BF16, FP16, FP32

CODECS: dict[str, type[Codec]] = {c.name: c for c in (FP32, BF16, FP16)}


def register(cls: type[Codec]) -> type[Codec]:
    CODECS[cls.name] = cls
    return cls


__all__ = ["CODECS", "Codec", "LayerStore", "register"]
