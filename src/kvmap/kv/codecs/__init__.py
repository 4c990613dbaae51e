"""The codecs: importing this package registers every codec in ``CODECS`` (declared in
``base.py``; each codec file registers its own classes with ``@CODECS.register``)."""
from __future__ import annotations

from kvmap.kv.codecs import fp8, integer, kivi, none  # noqa: F401  (they register)
from kvmap.kv.codecs.base import CODECS, Codec, LayerStore, ScaledRead
from kvmap.kv.codecs.rows import HeadRows

__all__ = ["CODECS", "Codec", "HeadRows", "LayerStore", "ScaledRead"]
