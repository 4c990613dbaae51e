"""K and V in stacked buffers (``kvmap.kv.codecs.paired``) against the two quantizers
each with its own tensors, for every case of the codec matrix that pairs: the same
names, shapes and bytes in the store, the same codes and parameters after the engine's
writes (stacked eager encode, or the native one), the same row reads; and the stacked
row gather against two single gathers."""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch

from kvmap.kv.codecs import HeadRows, LayerStore
from kvmap.kv.codecs import native
from kvmap.kv.codecs.paired import buffers, pairs


def _matrix():
    spec = importlib.util.spec_from_file_location(
        "codec_matrix_paired", Path(__file__).with_name("test_codecs.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_m = _matrix()
CASES, GEOM, NUM_BLOCKS, fill, make = _m.CASES, _m.GEOM, _m.NUM_BLOCKS, _m.fill, _m.make
static_path = _m.static_path        # the fixture
TABLE = torch.tensor([[5, 2, 7], [0, 3, 0]])


def _apart(codec, dtype) -> LayerStore:
    """The store the codec would have without stacking: one quantizer after the other."""
    store = LayerStore({}, state={"compute_dtype": dtype, "layer_id": 0})
    for q in codec.quant.values():
        q.allocate(NUM_BLOCKS, GEOM, "cpu", dtype, store)
    return store


@pytest.mark.parametrize("native_write", [True, False], ids=["native", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_paired_store_equals_apart(case, dtype, native_write, static_path,  # noqa: F811
                                   monkeypatch):
    """Paired writes run the native encode where it applies (``native.py``; eager if it
    cannot build here) or the stacked eager one; both store the bytes of the apart
    quantizers' eager writes."""
    monkeypatch.setattr(native, "ENABLED", native_write)
    codec = make(case, static_path)
    quant = getattr(codec, "quant", None)
    if not quant or not pairs(quant["k"], quant["v"]):
        pytest.skip("K and V are not quantized alike: no stacked buffers")
    paired = codec.allocate(NUM_BLOCKS, GEOM, "cpu", dtype, layer_id=0)
    apart = _apart(codec, dtype)
    assert buffers(paired) is not None and buffers(apart) is None
    assert [(n, t.shape, t.dtype) for n, t in paired.blocks.items()] == \
        [(n, t.shape, t.dtype) for n, t in apart.blocks.items()]
    assert paired.block_bytes() == apart.block_bytes()
    fill(codec, paired, dtype)
    fill(codec, apart, dtype)
    for name, t in paired.blocks.items():
        assert torch.equal(t, apart.blocks[name]), name
    rows = HeadRows.of(TABLE, GEOM.block_size, GEOM.num_kv_heads)
    for method in ("read_rows", "read_rows_scaled"):
        got, want = getattr(codec, method)(paired, rows), getattr(codec, method)(apart, rows)
        assert (got is None) == (want is None), method
        for g, w in zip(got or (), want or ()):
            if method == "read_rows":
                assert torch.equal(g, w), method
                continue
            for field in ("y", "scale", "bias"):
                a, b = getattr(g, field), getattr(w, field)
                assert (a is None) == (b is None) and (a is None or torch.equal(
                    a.to(b.dtype), b)), (method, field)
    # a block copied in the paired store lands in both halves' buffers
    paired.copy_blocks(torch.tensor([5]), torch.tensor([9]))
    assert torch.equal(buffers(paired).q.full[:, 9], buffers(paired).q.full[:, 5])


@pytest.mark.parametrize("row_bytes", [16, 256])        # blocks first; row gather
@pytest.mark.parametrize("param_heads", [1, 3])
def test_gather_pair_equals_two_gathers(row_bytes, param_heads):
    H, bs, n = 3, 4, 9
    t = torch.randint(0, 255, (2, n, bs, param_heads, row_bytes), dtype=torch.uint8)
    rows = HeadRows.of(torch.tensor([[4, 1], [8, 4]]), bs, H)
    got = rows.gather_pair(t)
    assert got.shape == (2, H, 2 * 2 * bs, row_bytes)
    for i in range(2):
        assert torch.equal(got[i], rows.gather(t[i].contiguous()))


def test_native_write_builds_here():
    """The native encode is what paired int writes run on this machine (a compiler is
    present); where it cannot build, the eager path above still holds the bytes."""
    if not native.ENABLED:
        pytest.skip("KVMAP_NATIVE=0")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine")
    assert native.ops() is not None, native.LIBRARY.broken
