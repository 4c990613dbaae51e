"""8-bit float KV codec ``fp8(format=e4m3|e5m2)``: values scaled into the float8 range
and cast to torch's ``float8_e4m3fn`` (max 448, 3 mantissa bits) or ``float8_e5m2``
(max 57344, 2 mantissa bits), stored as their uint8 bit patterns (Micikevicius et al.
2022, "FP8 Formats for Deep Learning"; vLLM's fp8 KV cache).

Default: one scale per tensor (per write call, replicated per slot), symmetric -- the
usual fp8 KV setting; every option of :mod:`kvmap.kv.codecs.scaled` applies.
"""
from __future__ import annotations

from kvmap.kv.codecs.base import CODECS
from kvmap.kv.codecs.quant import FP8_DTYPES, FP8Grid
from kvmap.kv.codecs.scaled import ScaledCodec


@CODECS.register
class FP8(ScaledCodec):
    name, default_granularity = "fp8", "tensor"
    defaults = {**ScaledCodec.defaults, "format": "e4m3"}

    def validate(self) -> None:
        if self.options["format"] not in FP8_DTYPES:
            raise ValueError(f"codec 'fp8': format={self.options['format']!r} is not one of "
                             f"{', '.join(FP8_DTYPES)}")
        super().validate()

    def grid(self) -> FP8Grid:
        return FP8Grid(self.options["format"])
