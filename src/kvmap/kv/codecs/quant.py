"""Pure quantization math shared by the int, fp8 and KIVI codecs.

A group of values x is mapped onto a grid of representable values y in
[-amplitude, amplitude] by a radius r and a centre z (gpt-fast ``quantize.py`` style):

    y = (x - z) * amplitude / r        encode: round / cast y onto the grid
    x ~ y * r / amplitude + z          decode

Symmetric (absmax) quantization has z = 0 and r = max|x|; asymmetric (min/max, "zero
point") has z = (max + min) / 2 and r = (max - min) / 2.  Storing (r, z) rather than
(scale, min) keeps both numbers inside fp16's normal range even for fp8-e5m2, whose
scale r / 57344 would underflow fp16.

Parameters are stored as fp16 and rounded *up* (:func:`fp16_params`) so that the stored
range still covers every value it was computed from: rounding never clips.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP16_MAX = 65504.0
_TINY = 1e-12          # floor for r: an all-zero group decodes to exact zeros
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class IntGrid:
    """b-bit integer codes in uint8, packed 8 // bits to a byte along the last dim.

    Symmetric grids use the integers -(2^(b-1)-1) .. 2^(b-1)-1 (code = y + 2^(b-1));
    asymmetric grids use all 2^b codes, y = code - (2^b - 1) / 2 (half-integers).
    """

    bits: int
    symmetric: bool

    @property
    def amplitude(self) -> float:
        return float(2 ** (self.bits - 1) - 1) if self.symmetric else (2 ** self.bits - 1) / 2

    @property
    def offset(self) -> float:
        return float(2 ** (self.bits - 1)) if self.symmetric else (2 ** self.bits - 1) / 2

    def stored_dim(self, dim: int) -> int:
        return dim * self.bits // 8

    def encode(self, y: torch.Tensor) -> torch.Tensor:
        """y (..., D) float on the grid's scale -> packed uint8 (..., D * bits / 8)."""
        a = self.amplitude
        codes = (y.clamp(-a, a) + self.offset).round_().to(torch.uint8)
        return pack(codes, self.bits)

    def decode(self, q: torch.Tensor) -> torch.Tensor:
        """packed uint8 (..., D * bits / 8) -> y (..., D) float32."""
        return unpack(q, self.bits, torch.float32).sub_(self.offset)

    def codes(self, q: torch.Tensor, dtype: torch.dtype
              ) -> tuple[torch.Tensor, float, float]:
        """packed uint8 -> (c, mult, shift) with y = c * mult + shift exactly, c (..., D)
        int8 and centred on zero, so that q . c or probs @ c carry no large constant
        term that a product rounded to bf16 would then have to cancel:

            8 bits        c = code - 128 (one XOR on the bytes)   shift 0 or 1/2
            b < 8, sym.   c = code - 2^(b-1)                      mult 1
            b < 8, asym.  c = 2 code - (2^b - 1), odd integers    mult 1/2

        ``q`` is modified in place (pass a copy, e.g. an index_select result)."""
        if self.bits == 8:
            return q.bitwise_xor_(0x80).view(torch.int8), 1.0, 128.0 - self.offset
        c = unpack(q, self.bits).view(torch.int8)
        if self.symmetric:
            return c.sub_(2 ** (self.bits - 1)), 1.0, 0.0
        return c.mul_(2).sub_(2 ** self.bits - 1), 0.5, 0.0


@dataclass(frozen=True)
class FP8Grid:
    """torch float8 values, stored as their uint8 bit patterns (CPU indexing of float8
    tensors is not implemented, uint8 views are)."""

    format: str        # "e4m3" | "e5m2"
    bits: int = 8

    @property
    def dtype(self) -> torch.dtype:
        return FP8_DTYPES[self.format]

    @property
    def amplitude(self) -> float:
        return float(torch.finfo(self.dtype).max)

    def stored_dim(self, dim: int) -> int:
        return dim

    def encode(self, y: torch.Tensor) -> torch.Tensor:
        a = self.amplitude
        return y.clamp(-a, a).to(self.dtype).view(torch.uint8)

    def decode(self, q: torch.Tensor) -> torch.Tensor:
        return self.codes(q, torch.float32)[0]

    def codes(self, q: torch.Tensor, dtype: torch.dtype
              ) -> tuple[torch.Tensor, float, float]:
        """uint8 bit patterns -> (y in ``dtype``, 1.0, 0.0); every e4m3 / e5m2 value is
        exact in bf16, fp16 and fp32."""
        if q.device.type != "cpu":
            return q.view(self.dtype).to(dtype), 1.0, 0.0
        # a 256-entry table lookup: CPU float8 -> float casts are far slower
        return _fp8_table(self.dtype, dtype).index_select(0, q.flatten().int()).view(
            q.shape), 1.0, 0.0


_FP8_TABLES: dict[tuple[torch.dtype, torch.dtype], torch.Tensor] = {}


def _fp8_table(fp8: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """The 256 values of ``fp8``'s bit patterns in ``dtype`` (CPU), built once: three
    operators fewer per read, and a read runs twice per layer and decode step."""
    table = _FP8_TABLES.get((fp8, dtype))
    if table is None:
        table = torch.arange(256, dtype=torch.uint8).view(fp8).to(dtype)
        _FP8_TABLES[(fp8, dtype)] = table
    return table


Grid = IntGrid | FP8Grid


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes < 2^bits, (..., D) -> (..., Db) with Db = D * bits / 8, in bit planes:
    byte i holds values i, i + Db, i + 2 Db, ... at bits 0, b, 2b, ...

        int4, D = 8:   byte i = c[i] | c[i + 4] << 4          i = 0..3

    Planes (rather than neighbours in a byte) let ``unpack`` write each plane as one
    contiguous slice."""
    if bits == 8:
        return codes
    planes = codes.view(*codes.shape[:-1], 8 // bits, -1)            # (..., per, Db)
    packed = planes[..., 0, :].clone()
    for j in range(1, 8 // bits):
        packed |= planes[..., j, :] << (bits * j)
    return packed


def unpack(packed: torch.Tensor, bits: int, dtype: torch.dtype = torch.uint8
           ) -> torch.Tensor:
    """Inverse of :func:`pack`: (..., Db) uint8 -> (..., D) codes in ``dtype``. The
    planes are computed whole and stacked, so that every operator runs over contiguous
    memory (writing each plane into a strided slice of the output was 3x slower), and
    converted once at the end."""
    if bits == 8:
        return packed.to(dtype)
    mask, per = 2 ** bits - 1, 8 // bits
    planes = [packed & mask] + [(packed >> (bits * j)) & mask for j in range(1, per - 1)]
    planes.append(packed >> (bits * (per - 1)))       # the top plane has no higher bits
    codes = torch.stack(planes, -2).flatten(-2)
    return codes if dtype == torch.uint8 else codes.to(dtype)


def range_params(lo: torch.Tensor, hi: torch.Tensor, symmetric: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-group minimum and maximum -> fp16 (r, z), z None when symmetric."""
    if symmetric:
        return fp16_params(torch.maximum(lo.abs(), hi.abs()), None)
    return fp16_params((hi - lo) / 2, (hi + lo) / 2)


def call_params(x: torch.Tensor, dims: tuple[int, ...], symmetric: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``range_params(*minmax(x, dims, symmetric), symmetric)``, the same values; the
    symmetric range is max|x| directly (two operators, not six: the encode runs once
    per layer and step)."""
    if symmetric:
        return fp16_params(x.abs().amax(dims, keepdim=True), None)
    return range_params(*minmax(x, dims, False), False)


def fp16_params(r: torch.Tensor, z: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Round float32 (r, z) to fp16 so that [z16 - r16, z16 + r16] still covers
    [z - r, z + r]: widen r by z's rounding error, then round r up (x (1 + 2^-10) beats
    fp16's 2^-11 relative rounding error).  Ranges beyond fp16 are clipped to +-65504."""
    z16 = None
    if z is not None:
        z16 = z.clamp(-FP16_MAX, FP16_MAX).half()
        r = r + (z - z16.float()).abs()
    r16 = (r * (1 + 2 ** -10)).clamp(max=FP16_MAX).half()
    return r16, z16


def quantize(x: torch.Tensor, r: torch.Tensor, z: torch.Tensor | None, grid: Grid
             ) -> torch.Tensor:
    """x (..., G, g) float, r and z broadcastable to (..., G, 1) -> stored (..., G*g')."""
    return grid.encode(on_grid(x, r, z, grid).flatten(-2))


def on_grid(x: torch.Tensor, r: torch.Tensor, z: torch.Tensor | None, grid: Grid
            ) -> torch.Tensor:
    """y = (x - z) * amplitude / r, float32, x's shape (r and z broadcast to it): what
    ``grid.encode`` rounds. A single group per row needs no (G, g) view of x."""
    inv_step = grid.amplitude / r.float().clamp_min(_TINY)
    return (x - z.float()) * inv_step if z is not None else x * inv_step


def dequantize(q: torch.Tensor, r: torch.Tensor, z: torch.Tensor | None, grid: Grid,
               dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize`: stored (..., Ds) -> (..., D) in ``dtype``. r and z,
    broadcastable to (..., G, 1), each cover one of G equal groups of the D values.

    Integer grids: x = code * step + (z - offset * step), step = r / amplitude. The
    grid's offset is folded into the small per-group shift, so that the codes pass
    through fp32 three times (convert, multiply, add) before the cast to ``dtype``,
    unpacked as uint8 first (a decode step runs this over all of a batch's K and V)."""
    step = r.float() / grid.amplitude                                # (..., G, 1)
    if isinstance(grid, IntGrid):
        shift = step * -grid.offset
        if z is not None:
            shift = shift.add_(z.float())
        y = unpack(q, grid.bits).to(torch.float32)
        y = y.view(*y.shape[:-1], r.shape[-2], -1)                   # (..., G, g)
        return y.mul_(step).add_(shift).flatten(-2).to(dtype)
    y = grid.decode(q)
    y = y.view(*y.shape[:-1], r.shape[-2], -1)                      # (..., G, g)
    x = y.mul_(step)
    if z is not None:
        x = x.add_(z.float())
    return x.flatten(-2).to(dtype)


def minmax(x: torch.Tensor, dims: tuple[int, ...], symmetric: bool,
           keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) of x over ``dims`` (kept as size 1); symmetric gives (-max|x|, max|x|).
    Entries where the broadcastable bool mask ``keep`` is False are ignored."""
    if symmetric:
        a = x.abs() if keep is None else x.abs().masked_fill(~keep, 0)
        a = a.amax(dims, keepdim=True)
        return -a, a
    if keep is None:
        return x.amin(dims, keepdim=True), x.amax(dims, keepdim=True)
    return (x.masked_fill(~keep, float("inf")).amin(dims, keepdim=True),
            x.masked_fill(~keep, float("-inf")).amax(dims, keepdim=True))
