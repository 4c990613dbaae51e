"""Serialize one KV block (all layers) to bytes and back, bit-exact, without pickle.

A block is a list over layers; each layer is an ordered ``name -> tensor`` mapping (or
the ``[(name, tensor), ...]`` list that ``LayerStore.block_to_bytes`` returns), e.g.
``{"k": (16, 3, 64) bf16, "v": ...}`` or ``{"k_q": uint8, "k_scale": fp16, ...}``.

Frame layout (little endian)::

    header (28 bytes)
      magic "KVMB" | version u16 | flags u16 | num_layers u32 | num_tensors u32
      | payload_bytes u64 | crc32 u32
    payload (payload_bytes), one entry per tensor, layers in order:
      layer u32 | name_len u16 | dtype_code u8 | ndim u8 | name (utf-8)
      | shape (ndim x u64) | raw bytes (numel * itemsize, C order)

The CRC32 (``zlib.crc32``) covers the header fields before it and the whole payload, so
a flipped bit anywhere or a truncated frame is caught by :func:`verify` before any
tensor is built. The CRC is not a defence against a writer who recomputes it, so every
header and descriptor field is bounded before anything is allocated (``MAX_LAYERS``,
``MAX_NDIM``, a tensor count that the payload can hold, shapes that fit the frame), and
every failure to decode -- whatever Python raises -- is a :class:`CorruptBlockError`.
Authenticity (who wrote the frame) is the tiers' business (``auth.py``). Tensor bytes are copied through ``view(torch.uint8)``, which is what
makes bfloat16 and float8 (no numpy dtype) round trip exactly.
"""
from __future__ import annotations

import math
import struct
import zlib
from typing import Iterable, Mapping, NamedTuple, Sequence, Union

import torch

MAGIC = b"KVMB"
VERSION = 1
KNOWN_FLAGS = 0  # no flag is defined yet; any set bit is rejected
_HEADER = struct.Struct("<4sHHIIQI")
_CRC_OFFSET = _HEADER.size - 4  # the CRC covers header[:_CRC_OFFSET] + payload
_DESC = struct.Struct("<IHBB")
HEADER_BYTES = _HEADER.size
MAX_LAYERS = 4096   # far above any model; bounds the per-layer dicts a header asks for
MAX_NDIM = 8        # block tensors are (block, heads, dim)-like; 8 leaves room
# what a frame decoder may raise besides CorruptBlockError; callers that decode frames
# they did not just build catch DECODE_ERRORS and count a miss
DECODE_ERRORS = (ValueError, struct.error, RuntimeError, MemoryError, OverflowError)

# Stable on-disk codes: never renumber, only append.
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float8_e4m3fn: 4,
    torch.float8_e5m2: 5, torch.uint8: 6, torch.int8: 7, torch.int16: 8, torch.int32: 9,
    torch.int64: 10, torch.float64: 11, torch.bool: 12,
}
_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}

LayerTensors = Union[Mapping[str, torch.Tensor], Sequence[tuple[str, torch.Tensor]]]


class CorruptBlockError(ValueError):
    """A frame failed a check; ``field`` names which: magic, version, flags, length,
    checksum or descriptor."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"corrupt KV block ({field}): {detail}")
        self.field = field


class BlockHeader(NamedTuple):
    num_layers: int
    num_tensors: int
    payload_bytes: int


def _items(layer: LayerTensors) -> Sequence[tuple[str, torch.Tensor]]:
    return list(layer.items()) if isinstance(layer, Mapping) else list(layer)


def encode_block(block: Sequence[LayerTensors]) -> bytes:
    """Serialize ``block`` (list over layers) into one frame. Tensors may live on any
    device and need not be contiguous; nothing is mutated. Raises ValueError naming a
    tensor with an unsupported dtype, a duplicate name or a name that is not a str."""
    entries = []  # (layer, name_utf8, dtype_code, shape, flat uint8 view)
    for layer, tensors in enumerate(block):
        seen: set[str] = set()
        for name, t in _items(tensors):
            if not isinstance(name, str) or not name or name in seen:
                raise ValueError(f"layer {layer}: tensor name {name!r} is empty, "
                                 "not a str, or repeated")
            seen.add(name)
            code = DTYPE_CODES.get(t.dtype)
            if code is None:
                raise ValueError(f"layer {layer}: tensor {name!r} has dtype {t.dtype}, "
                                 f"serde stores only {sorted(map(str, DTYPE_CODES))}")
            flat = t.detach().reshape(-1).view(torch.uint8)
            entries.append((layer, name.encode(), code, tuple(t.shape), flat))

    payload_bytes = sum(_DESC.size + len(n) + 8 * len(s) + f.numel()
                        for _, n, _, s, f in entries)
    buf = bytearray(HEADER_BYTES + payload_bytes)
    out = torch.frombuffer(buf, dtype=torch.uint8)
    offset = HEADER_BYTES
    for layer, name, code, shape, flat in entries:
        _DESC.pack_into(buf, offset, layer, len(name), code, len(shape))
        offset += _DESC.size
        buf[offset:offset + len(name)] = name
        offset += len(name)
        struct.pack_into(f"<{len(shape)}Q", buf, offset, *shape)
        offset += 8 * len(shape)
        out[offset:offset + flat.numel()].copy_(flat)  # device -> host copy if needed
        offset += flat.numel()
    del out  # release the buffer export before hashing

    _HEADER.pack_into(buf, 0, MAGIC, VERSION, 0, len(block), len(entries), payload_bytes, 0)
    view = memoryview(buf)
    crc = zlib.crc32(view[HEADER_BYTES:], zlib.crc32(view[:_CRC_OFFSET]))
    struct.pack_into("<I", buf, _CRC_OFFSET, crc)
    return bytes(buf)


def peek_header(data: bytes | bytearray | memoryview) -> BlockHeader:
    """Check magic, version, flags and length (not the checksum) and return the header.
    Cheap: used to reject non-frames at put time. Raises CorruptBlockError."""
    size = len(memoryview(data).cast("B"))
    if size < HEADER_BYTES:
        raise CorruptBlockError("length", f"{size} bytes is shorter than the "
                                          f"{HEADER_BYTES}-byte header")
    magic, version, flags, num_layers, num_tensors, payload_bytes, _ = \
        _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptBlockError("magic", f"expected {MAGIC!r}, got {magic!r}")
    if version != VERSION:
        raise CorruptBlockError("version", f"expected {VERSION}, got {version}")
    if flags & ~KNOWN_FLAGS:
        raise CorruptBlockError("flags", f"unknown flag bits {flags:#06x}")
    if size - HEADER_BYTES != payload_bytes:
        raise CorruptBlockError("length", f"header says {payload_bytes} payload bytes, "
                                          f"frame holds {size - HEADER_BYTES}")
    if num_layers > MAX_LAYERS:
        raise CorruptBlockError("length", f"num_layers {num_layers} is over {MAX_LAYERS}")
    if num_tensors * _DESC.size > payload_bytes:
        raise CorruptBlockError("length", f"{num_tensors} tensors cannot fit in "
                                          f"{payload_bytes} payload bytes")
    return BlockHeader(num_layers, num_tensors, payload_bytes)


def verify(data: bytes | bytearray | memoryview) -> BlockHeader:
    """:func:`peek_header` plus the CRC32 over header and payload. Raises
    CorruptBlockError; returns the header when the frame is intact."""
    header = peek_header(data)
    view = memoryview(data).cast("B")
    stored = struct.unpack_from("<I", view, _CRC_OFFSET)[0]
    actual = zlib.crc32(view[HEADER_BYTES:], zlib.crc32(view[:_CRC_OFFSET]))
    if stored != actual:
        raise CorruptBlockError("checksum", f"stored crc32 {stored:#010x}, "
                                            f"computed {actual:#010x}")
    return header


def decode_block(data: bytes | bytearray | memoryview, check_crc: bool = True
                 ) -> list[dict[str, torch.Tensor]]:
    """Inverse of :func:`encode_block`: a list over layers of ``{name: tensor}`` in the
    encoded order, on CPU, each tensor owning fresh memory. Raises CorruptBlockError.
    ``check_crc=False`` skips only the CRC, for a frame whose tier has just checked it
    (``Tier.verify_reads``); every structural check still runs."""
    try:
        return _decode(data, check_crc)
    except CorruptBlockError:
        raise
    except DECODE_ERRORS as e:    # anything the bounds above missed is still a bad frame
        raise CorruptBlockError("descriptor", f"{type(e).__name__}: {e}") from None


def _decode(data, check_crc: bool) -> list[dict[str, torch.Tensor]]:
    header = verify(data) if check_crc else peek_header(data)
    view = memoryview(data).cast("B")
    block: list[dict[str, torch.Tensor]] = [{} for _ in range(header.num_layers)]
    offset, end = HEADER_BYTES, len(view)
    for index in range(header.num_tensors):
        if offset + _DESC.size > end:
            raise CorruptBlockError("descriptor", f"tensor {index} starts past the end")
        layer, name_len, code, ndim = _DESC.unpack_from(view, offset)
        offset += _DESC.size
        dtype = _DTYPES.get(code)
        if layer >= header.num_layers or dtype is None or ndim > MAX_NDIM:
            raise CorruptBlockError("descriptor", f"tensor {index}: layer {layer} of "
                                                  f"{header.num_layers}, dtype code {code}, "
                                                  f"ndim {ndim} (at most {MAX_NDIM})")
        if offset + name_len + 8 * ndim > end:
            raise CorruptBlockError("descriptor", f"tensor {index}: name and shape run "
                                                  "past the end")
        try:
            name = bytes(view[offset:offset + name_len]).decode()
        except UnicodeDecodeError:
            raise CorruptBlockError("descriptor", f"tensor {index}: name is not utf-8") \
                from None
        if not name or name in block[layer]:
            raise CorruptBlockError("descriptor", f"tensor {index}: name {name!r} is "
                                                  "empty or repeated")
        offset += name_len
        shape = struct.unpack_from(f"<{ndim}Q", view, offset)
        offset += 8 * ndim
        nbytes = math.prod(shape) * dtype.itemsize     # exact: Python ints
        if offset + nbytes > end:
            raise CorruptBlockError("descriptor", f"tensor {name!r} runs past the end")
        if nbytes:
            raw = torch.frombuffer(bytearray(view[offset:offset + nbytes]), dtype=torch.uint8)
            block[layer][name] = raw.view(dtype).reshape(shape)
        else:
            block[layer][name] = torch.empty(shape, dtype=dtype)
        offset += nbytes
    if offset != end:
        raise CorruptBlockError("descriptor", f"{end - offset} bytes left after the "
                                              f"last tensor")
    return block


def check_finite(tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Raise ``CorruptBlockError("nonfinite")`` when a floating tensor holds NaN or inf.
    The K, V and scales of a computed block are finite: a frame that is not was written
    by a faulty or hostile writer (a key holder of a shared pool can seal anything) and
    would poison every attention that reads it. Integer codes are not checked."""
    for name, t in tensors:
        if t.is_floating_point() and t.numel() and not bool(
                torch.isfinite(t.float() if t.element_size() == 1 else t).all()):
            raise CorruptBlockError("nonfinite", f"tensor {name!r} holds NaN or inf")
