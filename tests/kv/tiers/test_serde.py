"""serde: bit-exact round trips for every stored dtype, and every corruption caught."""
from __future__ import annotations

import struct

import pytest
import torch

from kvmap.kv.codecs.base import LayerStore
from kvmap.kv.tiers import serde
from kvmap.kv.tiers.serde import CorruptBlockError, decode_block, encode_block

DTYPES = list(serde.DTYPE_CODES)


def random_tensor(shape, dtype, seed=0) -> torch.Tensor:
    """Arbitrary bit patterns (NaNs, infs, denormals included) of ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    numel = 1
    for d in shape:
        numel *= d
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(16, 3, 64), (), (0, 4), (5,)])
def test_round_trip_is_bit_exact(dtype, shape):
    t = random_tensor(shape, dtype)
    (layer,) = decode_block(encode_block([{"x": t}]))
    assert list(layer) == ["x"] and same_bits(layer["x"], t)


def test_multi_layer_codec_block_keeps_names_order_and_layers():
    block = [{"k_q": random_tensor((16, 3, 64), torch.uint8, i),
              "k_scale": random_tensor((16, 3, 1), torch.float16, i + 10),
              "v_q": random_tensor((16, 3, 64), torch.int8, i + 20)} for i in range(3)]
    block.append({})  # a layer may hold nothing
    out = decode_block(encode_block(block))
    assert len(out) == 4 and out[3] == {}
    for got, want in zip(out, block):
        assert list(got) == list(want)
        assert all(same_bits(got[n], want[n]) for n in want)


def test_layer_store_block_views_and_non_contiguous_input():
    blocks = {"k": random_tensor((4, 16, 3, 64), torch.bfloat16, 1),
              "v": random_tensor((4, 16, 3, 64), torch.bfloat16, 2)}
    pairs = LayerStore(blocks).block_to_bytes(2)  # [(name, view)]
    transposed = random_tensor((64, 16), torch.float8_e4m3fn, 3).t()
    out = decode_block(encode_block([pairs, [("t", transposed)]]))
    assert same_bits(out[0]["k"], blocks["k"][2]) and same_bits(out[0]["v"], blocks["v"][2])
    assert same_bits(out[1]["t"], transposed) and out[1]["t"].is_contiguous()


def test_frame_is_header_descriptors_and_raw_bytes_only():
    t = random_tensor((16, 3, 64), torch.bfloat16)
    data = encode_block([{"k": t}])
    assert len(data) == serde.HEADER_BYTES + 8 + len("k") + 8 * 3 + t.numel() * 2
    assert serde.verify(data) == serde.BlockHeader(1, 1, len(data) - serde.HEADER_BYTES)


def test_decoded_tensors_own_their_memory():
    data = bytearray(encode_block([{"k": torch.zeros(8, dtype=torch.int32)}]))
    (layer,) = decode_block(data)
    data[-4:] = b"\xff\xff\xff\xff"
    assert int(layer["k"][-1]) == 0


def _flip(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x01
    return bytes(out)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: _flip(d, 0), "magic"),
    (lambda d: d[:4] + struct.pack("<H", 99) + d[6:], "version"),
    (lambda d: d[:6] + struct.pack("<H", 4) + d[8:], "flags"),
    (lambda d: d[:-1], "length"),
    (lambda d: d + b"\x00", "length"),
    (lambda d: d[:10], "length"),
    (lambda d: _flip(d, len(d) - 1), "checksum"),      # a tensor byte
    (lambda d: _flip(d, serde.HEADER_BYTES + 8), "checksum"),  # a descriptor byte
    (lambda d: _flip(d, 12), "checksum"),               # num_tensors in the header
])
def test_corruption_raises_naming_the_field(mutate, field):
    data = encode_block([{"k": random_tensor((16, 3, 64), torch.bfloat16)}])
    with pytest.raises(CorruptBlockError, match=field) as info:
        decode_block(mutate(data))
    assert info.value.field == field and isinstance(info.value, ValueError)


def test_bad_input_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="complex64"):
        encode_block([{"k": torch.zeros(2, dtype=torch.complex64)}])
    with pytest.raises(ValueError, match="'k'"):
        encode_block([[("k", torch.zeros(2)), ("k", torch.zeros(2))]])
