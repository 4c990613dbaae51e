"""Decode attention operands: K and V of a batch's blocks in the layout the batched
matmuls want, (H*B, L, D) heads first, in the compute dtype. Attention
(``kvmap.model.attention``) asks for them once per layer and step and uses two
products, whatever the codec:

    scores = kv.scores(q)       (H*B, Gq, L)    q (H*B, Gq, D) pre-scaled queries
    out    = kv.values(probs)   (H*B, Gq, D)    probs (H*B, Gq, L)

Three ways in, by codec:

- unquantized (bf16, fp16, fp32): ``codec.read_rows``, one gather of the batch's slots
  straight into heads-first order through an index built once per step
  (``kvmap.kv.codecs.rows``; a gather of blocks then a permuting copy would be two
  passes) -> ``DenseKV``;
- one scale per token and head (int8, fp8 by default; per head / tensor): codes and
  their map heads first through the same row index (``codec.read_rows_scaled``), the
  codes converted to the compute dtype in one contiguous pass, the scales applied to
  the small scores and probabilities (L per query instead of L * D values)
  -> ``FoldedKV`` of ``SlotOperand``; a per-layer (static) map comes from the block
  read (``codec.read_scaled``) -> ``FoldedKV`` of ``ScaledOperand``:

      per token:  scores[l] = s[l] (q . y[l]) + b[l] sum(q)
                  out       = (probs * s) @ y + probs @ b
      per channel, all tokens:  scores = (q * s) . y + q . b
                                out    = (probs @ y) * s + sum(probs) * b

- scales per group of channels (int4, int2 by default): folding would cost one product
  per group, so ``codec.read_rows`` gathers the batch's codes and scales heads first
  the same way and decodes them in fp32 over contiguous tensors (unpack as uint8,
  convert, multiply, add the per-group shift that holds the grid's offset, cast):
  the arithmetic of ``codec.read``, the same values -> ``DecodedKV``.

A codec whose map varies over tokens and channels at once (KIVI keys, per-block channel
ranges) has neither form and gets ``DenseKV`` over ``codec.read``. Which path is
cheaper was measured per layer (docs/architecture.md); both quantized kinds are
``CodesKV``.
"""
from __future__ import annotations

import torch

from kvmap.kv.codecs import Codec, HeadRows, LayerStore, ScaledRead
from kvmap.kv.codecs.none import PlainCodec

def decode_kv(codec: Codec, store: LayerStore, table: torch.Tensor, num_kv_heads: int,
              rows: HeadRows | None = None, fused: bool = True):
    """Operands over the blocks of ``table`` (B, nb), one row per decoding sequence;
    key l of row b is slot l of the row's blocks, concatenated (L = nb * block_size).
    ``rows``: the batch's heads-first row index (built here when not given; attention
    builds it once per step for all layers). ``fused=False``: always dequantize through
    ``codec.read`` (``AttentionMetadata.fused_reads``: A/B tests, benchmarks)."""
    B = table.shape[0]
    if fused:
        if rows is None:
            block_size = next(iter(store.blocks.values())).shape[1]
            rows = HeadRows.of(table, block_size, num_kv_heads)
        if _folds(codec):
            scaled = codec.read_rows_scaled(store, rows)
            if scaled is not None and all(SlotOperand.fits(x, rows) for x in scaled):
                dtype = store.state["compute_dtype"]
                return FoldedKV(SlotOperand(scaled[0], B, dtype),
                                SlotOperand(scaled[1], B, dtype))
        else:
            kv = codec.read_rows(store, rows)
            if kv is not None:
                k, v = (x.view(num_kv_heads * B, rows.num_keys, -1) for x in kv)
                return DenseKV(k, v) if isinstance(codec, PlainCodec) else DecodedKV(k, v)
    ids = table.reshape(-1)
    scaled = codec.read_scaled(store, ids) if fused else None
    if scaled is None:
        k, v = codec.read(store, ids)
        return DenseKV(heads_first(k, B), heads_first(v, B))
    dtype = store.state["compute_dtype"]
    return FoldedKV(ScaledOperand(scaled[0], B, num_kv_heads, dtype),
                    ScaledOperand(scaled[1], B, num_kv_heads, dtype))


def _folds(codec: Codec) -> bool:
    """Whether to fold the scales into the products (``FoldedKV``): when one scale
    covers a whole head of each token (no channel groups), that is a few operators on
    the small scores and probabilities, cheaper than decode passes in fp32 over all of
    K and V; with groups it would cost a product per group, and the row read wins."""
    quant = getattr(codec, "quant", None)
    return bool(quant) and all(q.granularity != "group" for q in quant.values())


def heads_first(x: torch.Tensor, B: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """(B*nb, bs, H, D) -> (H*B, L, D) in ``dtype`` (default: x's), one copy."""
    _, _, H, D = x.shape
    src = x.view(B, -1, H, D).permute(2, 0, 1, 3)
    if dtype is None or dtype == x.dtype:
        return src.reshape(H * B, -1, D)
    out = torch.empty(src.shape, dtype=dtype, device=x.device)
    return out.copy_(src).view(H * B, -1, D)


class DenseKV:
    """K and V, each (H*B, L, D) in the compute dtype: plain batched products."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = k, v

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        return torch.bmm(q, self.k.transpose(1, 2))

    def values(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.bmm(probs, self.v)


class CodesKV:
    """Operands built from a quantizing codec's codes and scales (either kind below)."""


class DecodedKV(DenseKV, CodesKV):
    """K and V decoded by the codec's row read (``read_rows``): plain products."""


class FoldedKV(CodesKV):
    """K and V as :class:`ScaledOperand`: codes in the compute dtype, scales applied to
    the scores and probabilities."""

    def __init__(self, k: "ScaledOperand", v: "ScaledOperand"):
        self.k, self.v = k, v

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        return self.k.scores(q)

    def values(self, probs: torch.Tensor) -> torch.Tensor:
        return self.v.values(probs)


class SlotOperand:
    """Codes heads first with one scale (and bias) per slot and head, as the row read
    gives them (``codec.read_rows_scaled``): y (H*B, L, D) in the compute dtype (one
    contiguous conversion), scale and bias (H*B, 1, L) fp32 applied to the scores and
    probabilities:

        scores = (q . y) * s + sum(q) b          out = (probs * s) @ y + probs . b
    """

    def __init__(self, read: ScaledRead, B: int, dtype: torch.dtype):
        H, BL, D = read.y.shape
        L = BL // B
        self.dtype = dtype
        # each operator counts in a decode step: none for a conversion or a view that
        # would return its input (codes already in dtype; one sequence)
        y = read.y if read.y.dtype == dtype else read.y.to(dtype)
        self.y = y if B == 1 else y.view(H * B, L, D)
        self.scale = read.scale.view(H * B, 1, L)
        self.bias = None if read.bias is None else read.bias.view(H * B, 1, L)

    @staticmethod
    def fits(read: ScaledRead, rows: HeadRows) -> bool:
        """Whether ``read`` has one map per slot and head (not per group, not per layer)."""
        shape = (rows.num_heads, rows.num_seqs * rows.num_keys, 1)
        return tuple(read.scale.shape) == shape and (
            read.bias is None or tuple(read.bias.shape) == shape)

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        """q (H*B, Gq, D) in the compute dtype -> (H*B, Gq, L) in the compute dtype."""
        # the product times the fp32 scale is an fp32 product (type promotion): the
        # values of a cast then a multiplication, in one operator
        s = torch.mul(torch.bmm(q, self.y.transpose(1, 2)), self.scale)
        if self.bias is not None:
            s.baddbmm_(q.float().sum(-1, keepdim=True), self.bias)
        return s if s.dtype == self.dtype else s.to(self.dtype)

    def values(self, probs: torch.Tensor) -> torch.Tensor:
        """probs (H*B, Gq, L) -> (H*B, Gq, D) in the compute dtype."""
        ps = torch.mul(probs, self.scale)                     # fp32, as scale
        o = torch.bmm(ps if ps.dtype == self.dtype else ps.to(self.dtype), self.y)
        if self.bias is None:
            return o
        shift = torch.bmm(probs.float(), self.bias.transpose(1, 2))        # (H*B, Gq, 1)
        return o.float().add_(shift).to(self.dtype)


class ScaledOperand:
    """Codes y (H*B, L, D) in the compute dtype and one map per channel for all tokens
    (``scale``/``bias`` (H, 1, 1, D) fp32): a per-layer (static) range, which the block
    read gives (``codec.read_scaled``); per-slot maps go through :class:`SlotOperand`."""

    def __init__(self, read: ScaledRead, B: int, num_kv_heads: int, dtype: torch.dtype):
        if read.per_token:
            raise ValueError("ScaledOperand: a per-token map belongs in SlotOperand "
                             "(codec.read_rows_scaled)")
        H = num_kv_heads
        self.H, self.dtype = H, dtype
        self.y = heads_first(read.y, B, dtype)                      # (H*B, L, D)
        G = read.scale.shape[-1]
        g = self.y.shape[-1] // G

        def channels(p):                         # (1, 1, Hp, G) -> (H, 1, 1, D)
            p = p.reshape(-1, G).expand(H, G)
            return p.repeat_interleave(g, dim=-1)[:, None, None, :]
        self.scale = channels(read.scale)
        self.bias = None if read.bias is None else channels(read.bias)

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        """q (H*B, Gq, D) in the compute dtype -> (H*B, Gq, L) in the compute dtype."""
        HB, Gq, D = q.shape
        qh = q.view(self.H, -1, Gq, D).float()
        qs = (qh * self.scale).to(self.dtype).view(HB, Gq, D)
        s = torch.bmm(qs, self.y.transpose(1, 2))
        if self.bias is None:
            return s
        return (s.float() + (qh * self.bias).sum(-1).view(HB, Gq, 1)).to(self.dtype)

    def values(self, probs: torch.Tensor) -> torch.Tensor:
        """probs (H*B, Gq, L) -> (H*B, Gq, D) in the compute dtype."""
        HB, Gq, L = probs.shape
        D = self.y.shape[-1]
        o = torch.bmm(probs.to(self.dtype), self.y).float().view(self.H, -1, Gq, D)
        o.mul_(self.scale)
        if self.bias is not None:
            psum = probs.float().sum(-1).view(self.H, -1, Gq, 1)
            o.add_(psum * self.bias)
        return o.view(HB, Gq, D).to(self.dtype)
