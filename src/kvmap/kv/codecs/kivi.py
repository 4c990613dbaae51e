"""KIVI: ``kivi(bits=2|4, group_size=32, residual=128)``.

Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache".
Keys have outlier *channels*, so KIVI quantizes keys per channel (grouping tokens) and
values per token (grouping channels), both asymmetric (min/max), and keeps the most
recent ``residual`` tokens in full precision until a token group fills.

Mapping onto paged blocks (bs = block_size):

    keys    per channel, the token group is the block    (block_quant.py)
            k.q (nb, bs, H, D*bits/8) uint8, k.r / k.z (nb, H, D) fp16
    values  per token, groups of ``group_size`` channels (quantizers.SlotQuant; default
            32, or gcd(32, head_dim))
            v.q (nb, bs, H, D*bits/8) uint8, v.r / v.z (nb, bs, H, D/group_size) fp16

``residual`` -- KIVI's R -- becomes "keep the newest, not yet full block of keys in full
precision": with residual > 0 each block carries a full-precision key copy
k.fp (nb, bs, H, D) in the compute dtype and k.full (nb,) bool; attention reads a
partial block's exact keys and a full block's codes, and codes are always rounded once
from exact keys. So up to bs - 1 newest tokens are full precision, whatever R > 0 is,
and older tokens are quantized; the staging copy is resident for every block and is
counted in ``block_bytes`` (it costs more than the codes). With residual = 0 there is
no copy: a partial block's keys are re-encoded from its codes as the block fills (see
block_quant.py). Values need no staging in either case -- per-token groups are final
when written -- so unlike KIVI they are quantized at once, also inside the residual.
"""
from __future__ import annotations

from kvmap.kv.codecs.block_quant import BlockQuant
from kvmap.kv.codecs.quant import IntGrid
from kvmap.kv.codecs.quantizers import SlotQuant, TensorQuant
from kvmap.kv.codecs.scaled import QuantCodec


class KIVI(QuantCodec):
    name = "kivi"
    defaults = {"bits": 2, "group_size": None, "residual": 128}   # group_size: as int4's

    def validate(self) -> None:
        o = self.options
        if o["bits"] not in (2, 4):
            raise ValueError(f"codec 'kivi': bits={o['bits']!r} must be 2 or 4")
        r = o["residual"]
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise ValueError(f"codec 'kivi': residual={r!r} must be a non-negative integer")
        super().validate()

    def quantizers(self) -> dict[str, TensorQuant]:
        grid = IntGrid(self.options["bits"], symmetric=False)
        return {"k": BlockQuant("k", grid, symmetric=False,
                                staging=self.options["residual"] > 0),
                "v": SlotQuant("v", grid, False, "group", self.options["group_size"])}

