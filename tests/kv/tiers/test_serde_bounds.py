"""Hostile frames: headers and descriptors are bounded before anything is allocated, and
every failure to decode is a CorruptBlockError (never struct.error, MemoryError, ...)."""
from __future__ import annotations

import random
import struct
import zlib

import pytest
import torch

from kvmap.kv.tiers import serde
from kvmap.kv.tiers.serde import CorruptBlockError, decode_block, encode_block

_HEADER = struct.Struct("<4sHHIIQI")


def with_crc(buf: bytearray) -> bytes:
    """``buf`` with its CRC field recomputed: what a writer who knows the format sends."""
    crc = zlib.crc32(bytes(buf[serde.HEADER_BYTES:]), zlib.crc32(bytes(buf[:24])))
    struct.pack_into("<I", buf, 24, crc)
    return bytes(buf)


def header(num_layers: int, num_tensors: int, payload: bytes = b"") -> bytes:
    buf = bytearray(_HEADER.pack(serde.MAGIC, serde.VERSION, 0, num_layers, num_tensors,
                                 len(payload), 0) + payload)
    return with_crc(buf)


def test_a_28_byte_frame_asking_for_4g_layers_is_refused_before_allocating():
    data = header(2**32 - 1, 0)
    assert len(data) == 28
    with pytest.raises(CorruptBlockError, match="num_layers"):
        decode_block(data)


def test_more_tensors_than_the_payload_can_hold_is_refused():
    with pytest.raises(CorruptBlockError, match="cannot fit"):
        decode_block(header(1, 2**32 - 1, b"\0" * 64))


@pytest.mark.parametrize("desc, tail", [
    (struct.pack("<IHBB", 0, 1, 6, 255), b"k"),              # ndim 255
    (struct.pack("<IHBB", 0, 60000, 6, 1), b"k"),            # name past the end
    (struct.pack("<IHBB", 0, 1, 6, 3), b"k" + b"\0" * 8),    # shape past the end
    (struct.pack("<IHBB", 0, 2, 6, 0), b"\xff\xfe"),         # name not utf-8
    (struct.pack("<IHBB", 0, 1, 6, 2), b"k" + struct.pack("<2Q", 2**40, 2**40)),  # huge
])
def test_bad_descriptors_are_corrupt_blocks(desc, tail):
    with pytest.raises(CorruptBlockError):
        decode_block(header(1, 1, desc + tail))


def test_random_mutations_with_a_valid_crc_never_raise_anything_else():
    """300 frames with random bytes changed and the CRC recomputed: each decodes or is a
    CorruptBlockError, and nothing decoded holds more bytes than the frame."""
    good = encode_block([{"k": torch.arange(48, dtype=torch.uint8).reshape(4, 12),
                          "v": torch.ones(2, 3, dtype=torch.bfloat16)} for _ in range(2)])
    rng = random.Random(0)
    num_decoded = num_refused = 0
    for _ in range(300):
        buf = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(4, len(buf))] = rng.randrange(256)
        try:
            block = decode_block(with_crc(buf))
        except CorruptBlockError:
            num_refused += 1
            continue
        num_decoded += 1
        assert sum(t.numel() * t.element_size() for layer in block
                   for t in layer.values()) <= len(buf)
    assert num_refused > 0 and num_decoded + num_refused == 300
