"""Codec registry: spec-string name -> Codec class. One file per codec family."""
from __future__ import annotations

from kvmap.kv.codecs.base import Codec, LayerStore, ScaledRead
from kvmap.kv.codecs.fp8 import FP8
from kvmap.kv.codecs.integer import Int2, Int4, Int8
from kvmap.kv.codecs.kivi import KIVI
from kvmap.kv.codecs.none import BF16, FP16, FP32

CODECS: dict[str, type[Codec]] = {
    c.name: c for c in (FP32, BF16, FP16, FP8, Int8, Int4, Int2, KIVI)}


def register(cls: type[Codec]) -> type[Codec]:
    CODECS[cls.name] = cls
    return cls


__all__ = ["CODECS", "Codec", "LayerStore", "ScaledRead", "register"]
