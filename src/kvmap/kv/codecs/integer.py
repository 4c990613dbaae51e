"""Integer KV codecs ``int8``, ``int4``, ``int2``: b-bit codes packed 8 // b to a byte.

Uniform (round-to-nearest) quantization with an absmax or min/max range per group, as
in LLM.int8 / ZeroQuant-style KV quantization; the granularity, symmetry and scale rule
options are :mod:`kvmap.kv.codecs.scaled`'s. Storage per layer:

    k.q, v.q   (num_blocks, bs, H, D * b / 8) uint8       codes
    k.r, k.z   (num_blocks, bs, Hp, G) fp16               range per slot (scale=max|ema)

Defaults: int8 per token, symmetric; int4 and int2 per group of 32 channels, asymmetric
(a symmetric 2-bit grid has only the three levels -1, 0, 1).
"""
from __future__ import annotations

from typing import ClassVar

from kvmap.kv.codecs.base import CODECS
from kvmap.kv.codecs.quant import IntGrid
from kvmap.kv.codecs.scaled import ScaledCodec


class IntCodec(ScaledCodec):
    bits: ClassVar[int]

    def grid(self) -> IntGrid:
        return IntGrid(self.bits, self.options["symmetric"])


@CODECS.register
class Int8(IntCodec):
    name, bits = "int8", 8


@CODECS.register
class Int4(IntCodec):
    name, bits, default_granularity = "int4", 4, "group"
    defaults = {**ScaledCodec.defaults, "symmetric": False}


@CODECS.register
class Int2(IntCodec):
    name, bits, default_granularity = "int2", 2, "group"
    defaults = {**ScaledCodec.defaults, "symmetric": False}
