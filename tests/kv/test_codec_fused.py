"""Decode attention on codes with folded scales (``kvmap.model.quant_attention``) against
dequantize-then-attend, for every case of the codec matrix (``test_codecs.CASES``).

Tolerances: in fp32 the two are the same algebra in another order (relative error below
1e-5). In bf16 both round, at different places; each is compared with the exact product
of the dequantized values in float64, and the fused error may be at most twice the
dequantizing path's plus 2^-9 (one bf16 rounding). Then on the tiny model: greedy tokens
with int8 / fp8 / int4 caches do not depend on the path (fp32 model), and the codecs
that cannot fold their scales (KIVI, per-block channel ranges) say so.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from kvmap.model import quant_attention as qa


def _matrix():
    """The codec matrix module (test_codecs.py) by path: tests use --import-mode=importlib."""
    spec = importlib.util.spec_from_file_location(
        "codec_matrix", Path(__file__).with_name("test_codecs.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module           # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_m = _matrix()
CASES, GEOM, NUM_BLOCKS, fill, make = _m.CASES, _m.GEOM, _m.NUM_BLOCKS, _m.fill, _m.make
static_path = _m.static_path        # the fixture

TABLE = torch.tensor([[5, 2, 7], [0, 3, 0]])     # sequences a, b; b padded with block 0


def operands(codec, store, fused: bool, monkeypatch):
    return qa.decode_kv(codec, store, TABLE, GEOM.num_kv_heads, fused=fused)


def folds(case) -> bool:
    """Which codecs offer codes + scales: all quantizers with a per-slot or per-layer map."""
    if case.family in ("fp32", "bf16", "fp16") or case.family.startswith("kivi"):
        return False
    return not (case.granularity == "channel" and case.scale == "max")


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_fused_matches_dequantized(case, dtype, static_path, monkeypatch):  # noqa: F811
    codec = make(case, static_path)
    store = codec.allocate(NUM_BLOCKS, GEOM, "cpu", dtype, layer_id=0)
    fill(codec, store, dtype)
    dense = operands(codec, store, False, monkeypatch)
    fused = operands(codec, store, True, monkeypatch)
    assert isinstance(fused, qa.CodesKV) == folds(case)
    g = torch.Generator().manual_seed(3)
    H2, D = GEOM.num_kv_heads * TABLE.shape[0], GEOM.head_dim
    q = (torch.randn(H2, 3, D, generator=g) * D ** -0.5).to(dtype)
    s_dense, s_fused = dense.scores(q), fused.scores(q)
    probs = torch.softmax(s_dense.float(), -1).to(dtype)
    o_dense, o_fused = dense.values(probs), fused.values(probs)
    for out in (s_fused, o_fused):
        assert out.dtype == dtype
    assert s_fused.shape == (H2, 3, TABLE.shape[1] * GEOM.block_size)
    assert o_fused.shape == (H2, 3, D)
    # exact products of the values the dequantizing path decodes (in float64)
    k64, v64 = dense.k.double(), dense.v.double()
    s_ref = q.double() @ k64.transpose(1, 2)
    o_ref = probs.double() @ v64
    if dtype == torch.float32:
        assert rel(s_fused, s_ref) < 1e-5 and rel(o_fused, o_ref) < 1e-5
    else:
        assert rel(s_fused, s_ref) <= 2 * rel(s_dense, s_ref) + 2 ** -9
        assert rel(o_fused, o_ref) <= 2 * rel(o_dense, o_ref) + 2 ** -9


@pytest.mark.parametrize("spec", ["int8", "int8(symmetric=false)", "fp8", "int4",
                                  "int8(granularity=tensor,scale=ema)"])
def test_greedy_tokens_do_not_depend_on_the_path(spec, monkeypatch):
    from kvmap import LLM, SamplingParams
    llm = LLM(model="dummy:tiny", dtype="fp32", kv=spec, kv_memory="4MiB",
              enable_prefix_caching=False, max_num_batched_tokens=64)
    prompts = [[(7 * i + 3 * j) % 200 + 1 for j in range(n)] for i, n in enumerate((37, 21, 50))]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    runs = []
    for fused in (False, True):
        llm.engine.runner.fused_reads = fused
        runs.append([o.token_ids for o in llm.generate(prompts, params)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_row_read_equals_block_read(case, dtype, static_path):  # noqa: F811
    """``codec.read_rows`` (one gather through the step's heads-first index) returns what
    ``codec.read`` of the same blocks holds, re-laid out heads first, value for value;
    codecs without a row form say None, and those that fold say so for every case the
    block path folds."""
    from kvmap.kv.codecs import HeadRows
    codec = make(case, static_path)
    store = codec.allocate(NUM_BLOCKS, GEOM, "cpu", dtype, layer_id=0)
    fill(codec, store, dtype)
    rows = HeadRows.of(TABLE, GEOM.block_size, GEOM.num_kv_heads)
    got = codec.read_rows(store, rows)
    assert (got is not None) == (folds(case) or case.family in ("fp32", "bf16", "fp16"))
    if got is None:
        return
    k, v = codec.read(store, TABLE.reshape(-1))
    B = TABLE.shape[0]
    for x, ref in zip(got, (k, v)):
        assert x.dtype == dtype
        assert torch.equal(x.view(-1, rows.num_keys, GEOM.head_dim), qa.heads_first(ref, B))


@pytest.mark.parametrize("width", [2, 32], ids=["blocks-first", "rows"])
def test_head_rows_index_and_bad_head_count(width):
    """Row (h, b*L + l) of a gather is the value at slot(b, l), head h, whichever order
    it gathers in (int64 rows of 16 bytes go blocks first, of 256 bytes row by row);
    a tensor whose head count is neither 1 nor H is refused by name."""
    from kvmap.kv.codecs import HeadRows
    from kvmap.kv.codecs.rows import BLOCK_FIRST_BELOW
    assert (width * 8 < BLOCK_FIRST_BELOW) == (width == 2)
    bs, H = GEOM.block_size, GEOM.num_kv_heads
    rows = HeadRows.of(TABLE, bs, H)
    t = torch.arange(NUM_BLOCKS * bs * H * width).view(NUM_BLOCKS, bs, H, width)
    got = rows.gather(t)                                      # (H, B*L, 2)
    L = TABLE.shape[1] * bs
    for b in range(TABLE.shape[0]):
        for l in (0, bs + 3, L - 1):
            block, off = TABLE[b, l // bs], l % bs
            for h in range(H):
                assert torch.equal(got[h, b * L + l], t[block, off, h])
    shared = rows.gather(t[:, :, :1])
    assert torch.equal(shared[H - 1, L + 5], t[TABLE[1, 0], 5, 0])
    with pytest.raises(ValueError, match=f"{H + 1} heads per slot"):
        rows.gather(torch.zeros(NUM_BLOCKS, bs, H + 1, width))
