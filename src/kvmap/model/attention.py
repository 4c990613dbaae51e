"""Paged attention over codec-encoded KV blocks, for a batch that mixes decodes and
prefill chunks.

Batch layout (token axis of every activation, T tokens in all):

    [ d_0 d_1 ... d_{B-1} | chunk of seq a (C_a tokens) | chunk of seq b | ... ]
      one decode token        prefill chunks, each attending to its own cached
      per sequence            context plus itself (causal)

Per layer: the new K/V are written through the codec into their slots, then each
query reads back only its own sequence's blocks (``codec.read``), so attention always
sees exactly what the cache holds (quantized or not), and no step dequantizes more than
the blocks of the sequences in the batch.

Masks are built once per step (``AttentionMetadata``) and shared by all layers of one
kind. A sliding-window layer (``window`` = W tokens, itself included) gets metadata of
its own (``windowed``): each sequence's table starts at the block holding its first
visible key, the decode mask hides keys more than W - 1 behind the query, and prefill
tiles read only the keys their queries can see:

    keys ->    |<- released ->|<---- W - 1 ---->|q      query at slot q sees q-W+1 .. q

A sequence paged through the tiers (``kvmap.kv.offload.pager``) holds only its recent
blocks in the pool; its block table and slot count describe that resident part, and
``meta.offload.decode`` / ``meta.offload.prefill`` (an ``OffloadStep``) give, per decode
row / prefill segment, its paged-out front (``layer_kv(layer)`` fetches the layer's
K/V, each (H, L_off, D)). Every paged-out key precedes every query, so that
part needs no mask. Each part is attended separately, keeping its log-sum-exp, and the
two are merged exactly:

    lse = log(e^lse_res + e^lse_off)
    out = out_res * e^(lse_res - lse) + out_off * e^(lse_off - lse)

which is softmax attention over the union of the keys (up to rounding).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvmap.kv.codecs import Codec, HeadRows, LayerStore
from kvmap.kv.offload.decisions import OffloadStep
from kvmap.model import fused_decode, native_decode
from kvmap.model.fused_prefill import flash_chunk, flash_usable
from kvmap.model.quant_attention import decode_kv

NEG_INF = float("-inf")
QUERY_TILE = 256   # prefill queries per tile; tiles skip keys that the causal mask hides


@dataclass
class PrefillSegment:
    start: int                 # first token of the chunk in the batch
    end: int                   # one past its last token
    block_ids: torch.Tensor    # (nb,) the sequence's blocks covering all num_kv_slots
    num_kv_slots: int          # KV slots after this chunk is written (context + chunk)
    completes_prompt: bool = False   # the chunk's last token is the sequence's last


@dataclass
class LayerScores:
    """One layer's attention statistics for a selection policy, summed over the query
    heads of each KV head, fp32."""

    decode: torch.Tensor | None = None     # (B, H, L) the decode queries' attention
    window: dict[int, torch.Tensor] = field(default_factory=dict)       # prefill i ->
    #                                        (H, W, L_i) its last W queries' attention
    accumulated: dict[int, torch.Tensor] = field(default_factory=dict)  # prefill i ->
    #                                        (H, L_i) attention its chunk gave each slot


@dataclass
class LayerHoles:
    """One layer's emptied slot range ``(first, end)`` per decode row and per prefill
    segment: what a per-layer budget left there, masked out of attention."""

    decode: dict[int, tuple[int, int]] = field(default_factory=dict)
    prefill: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class AttentionMetadata:
    slot_ids: torch.Tensor                   # (T,) where each new token's K/V is written
    num_decode: int = 0
    decode_block_ids: torch.Tensor | None = None   # (B, nb) padded block tables
    decode_mask: torch.Tensor | None = None        # (1, B, 1, nb*bs) additive, 0 or -inf
    decode_lens: torch.Tensor | None = None        # (B,) int64 keys each row sees
    prefills: list[PrefillSegment] = field(default_factory=list)
    # attention statistics a selection policy asked for (kvmap.kv.policies): layer ->
    # LayerScores. Every prefill segment gets a window: a chunked policy compresses after
    # each chunk (W x L, cheap next to C x L).
    want_scores: bool = False
    observation_window: int = 1
    accumulate: bool = False
    scores: dict[int, LayerScores] = field(default_factory=dict)
    # slots a selection policy left empty in a layer (per-layer budgets), masked out
    holes: dict[int, LayerHoles] = field(default_factory=dict)
    # the tiers' part of this step: paged sequences' fronts (per decode row / prefill
    # segment) and prefix blocks being copied in layer by layer (wait(layer) before a
    # layer reads or writes its store); empty without tiers
    offload: OffloadStep = field(default_factory=OffloadStep)
    # the decode rows' heads-first gather index (quant_attention), built by the first
    # layer and shared by all
    decode_rows: HeadRows | None = None
    # per-layer block tables (kvmap.engine.layer_tables): layer -> its own metadata
    layers: list | None = None
    # a sliding-window layer's metadata (``windowed``): keys visible to a query, itself
    # included; None: every key of the context
    window: int | None = None
    # decode reads codes with their scales folded in (quant_attention); False: always
    # dequantize through codec.read (A/B tests, benchmarks: ModelRunner.fused_reads)
    fused_reads: bool = True

    @classmethod
    def build(cls, slot_ids: torch.Tensor, decode_tables: list[list[int]],
              decode_kv_lens: list[int], prefills: list[PrefillSegment], block_size: int,
              device, dtype: torch.dtype = torch.float32,
              window: int | None = None) -> "AttentionMetadata":
        """``window``: the metadata of a sliding-window layer; ``decode_tables`` and
        ``prefills`` are then already cut to their first visible block (``windowed``)."""
        meta = cls(slot_ids=slot_ids, num_decode=len(decode_tables), prefills=prefills,
                   window=window)
        if decode_tables:
            nb = max(len(t) for t in decode_tables)
            padded = [t + [t[0]] * (nb - len(t)) for t in decode_tables]  # pad: masked out
            meta.decode_block_ids = torch.tensor(padded, dtype=torch.long, device=device)
            lens = meta.decode_lens = torch.tensor(decode_kv_lens, dtype=torch.long,
                                                   device=device)
            key_idx = torch.arange(nb * block_size, device=device)
            visible = key_idx[None, :] < lens[:, None]                     # (B, L)
            if window is not None:        # the query is key len-1: keys len-W .. len-1
                visible &= key_idx[None, :] >= lens[:, None] - window
            mask = torch.zeros(visible.shape, dtype=torch.float32, device=device)
            meta.decode_mask = mask.masked_fill_(~visible, NEG_INF)[None, :, None, :].to(dtype)
        return meta

    def windowed(self, window: int, decode_tables: list[list[int]],
                 decode_kv_lens: list[int], block_size: int) -> "AttentionMetadata":
        """This step's metadata for a layer that attends through ``window`` tokens.
        ``decode_tables`` / ``decode_kv_lens``: what ``build`` got. Each table starts at
        the block of its first visible key -- ``first = (slots - chunk - W + 1) // bs``
        blocks of it are dead for every query of the step -- and slots count from there;
        the write slots, holes and statistics dicts are this metadata's own."""
        def first_block(num_slots: int, num_queries: int) -> int:
            return max(0, num_slots - num_queries - window + 1) // block_size

        tables, lens = [], []
        for table, n in zip(decode_tables, decode_kv_lens):
            first = first_block(n, 1)
            tables.append(table[first:])
            lens.append(n - first * block_size)
        prefills = []
        for seg in self.prefills:
            first = first_block(seg.num_kv_slots, seg.end - seg.start)
            prefills.append(PrefillSegment(seg.start, seg.end, seg.block_ids[first:],
                                           seg.num_kv_slots - first * block_size,
                                           seg.completes_prompt))
        dtype = self.decode_mask.dtype if self.decode_mask is not None else torch.float32
        meta = AttentionMetadata.build(self.slot_ids, tables, lens, prefills, block_size,
                                       self.slot_ids.device, dtype, window)
        for name in ("want_scores", "observation_window", "accumulate", "scores", "holes",
                     "offload"):
            setattr(meta, name, getattr(self, name))
        return meta


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, store: LayerStore,
                    codec: Codec, meta: AttentionMetadata, num_kv_heads: int,
                    layer_idx: int = 0, scale: float | None = None,
                    q_scaled: bool = False) -> torch.Tensor:
    """q: (T, Hq, D), k/v: (T, Hkv, D) with rotary already applied. Returns (T, Hq*D).
    Mutates ``store`` (writes k, v at ``meta.slot_ids``). Scores are scaled by ``scale``,
    by default ``D ** -0.5``; ``q_scaled``: q comes scaled already (``native_layer``)."""
    meta.offload.wait(layer_idx)
    if meta.layers is not None:          # per-layer block tables: this layer's own
        meta = meta.layers[layer_idx]
    T, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    codec.write(store, meta.slot_ids, k, v)
    if not q_scaled:
        q = q * (head_dim ** -0.5 if scale is None else scale)
    out = torch.empty((T, num_heads * head_dim), dtype=q.dtype, device=q.device)
    if meta.num_decode:
        _decode(q, store, codec, meta, num_kv_heads, layer_idx, out)
    for i, seg in enumerate(meta.prefills):
        kc, vc = codec.read(store, seg.block_ids)                         # (nb, bs, H, D)
        L = seg.num_kv_slots
        kc = kc.reshape(-1, num_kv_heads, head_dim)[:L].permute(1, 2, 0)  # (H, D, L)
        vc = vc.reshape(-1, num_kv_heads, head_dim)[:L].transpose(0, 1)   # (H, L, D)
        C = seg.end - seg.start
        qs = q[seg.start:seg.end].view(C, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        acc = None
        hole = meta.holes[layer_idx].prefill.get(i) if layer_idx in meta.holes else None
        ctx = meta.offload.prefill.get(i)
        if meta.want_scores:
            stats = meta.scores.setdefault(layer_idx, LayerScores())
            if meta.accumulate:
                acc = stats.accumulated[i] = torch.zeros(num_kv_heads, L, device=q.device)
            # paged-out keys join the window of the chunk that completes the prompt (the
            # one a final-only policy reads: kvmap.kv.offload.prefill)
            front = (ctx.layer_kv(layer_idx)[0] if ctx is not None and seg.completes_prompt
                     else None)
            stats.window[i] = _window_attention(qs, kc, meta.observation_window, hole, front)
        lse = (torch.empty((num_kv_heads, group, C), dtype=torch.float32, device=q.device)
               if ctx is not None else None)
        if acc is None and hole is None and meta.window is None and flash_usable(qs):
            o = flash_chunk(qs, kc.transpose(1, 2), vc, L - C, lse)      # (H, G, C, D)
        else:                                  # a sliding layer's band mask: tiled
            o = _causal_chunk(qs, kc, vc, L - C, acc, lse, hole, meta.window)
        if ctx is not None:
            o = _with_offloaded(qs, o, lse, ctx, layer_idx).to(o.dtype)
        out[seg.start:seg.end] = o.permute(2, 0, 1, 3).reshape(C, num_heads * head_dim)
    return out


def _decode(q: torch.Tensor, store: LayerStore, codec: Codec, meta: AttentionMetadata,
            num_kv_heads: int, layer_idx: int, out: torch.Tensor) -> None:
    """Attention of the B decode rows (the first B tokens; q pre-scaled) into out[:B]:
    one compiled kernel on the CPU (``fused_decode``, opt-in), else one native operator
    over the pool (``native_decode``) where the codec and the step allow, else batched
    products over the codes (``quant_attention``) or dequantized blocks."""
    B = meta.num_decode
    _, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    holes = meta.holes[layer_idx].decode if layer_idx in meta.holes else {}
    offloaded = meta.offload.decode
    if not offloaded and fused_decode.usable(q.device):
        mask = meta.decode_mask[0, :, 0, :].float()                       # (B, L)
        if holes:
            mask = mask.clone()
            for b, (first, end) in holes.items():
                mask[b, first:end] = NEG_INF
        fused = fused_decode.fused_decode_attention(
            q[:B], store, codec, meta.decode_block_ids, mask, meta.want_scores)
        if fused is not None:
            out[:B], probs = fused
            if meta.want_scores:
                meta.scores.setdefault(layer_idx, LayerScores()).decode = probs
            return
    if not (offloaded or holes or meta.want_scores) and meta.fused_reads and \
            native_decode.decode(q[:B], store, codec, meta.decode_block_ids,
                                 meta.decode_lens, meta.window, out[:B]):
        return
    # K, V batched over (H, B): dequantized, or codes with scales (quant_attention)
    if meta.decode_rows is None:
        block_size = next(iter(store.blocks.values())).shape[1]
        meta.decode_rows = HeadRows.of(meta.decode_block_ids, block_size, num_kv_heads)
    kv = decode_kv(codec, store, meta.decode_block_ids, num_kv_heads, meta.decode_rows,
                   meta.fused_reads)
    qd = q[:B].view(B, num_kv_heads, group, head_dim).transpose(0, 1).reshape(
        num_kv_heads * B, group, head_dim)                            # (H*B, G, D)
    scores = kv.scores(qd).view(num_kv_heads, B, group, -1)
    scores += meta.decode_mask                                        # (H, B, G, L)
    for b, (first, end) in holes.items():
        scores[:, b, :, first:end] = NEG_INF
    if offloaded:
        probs, lse_res = softmax_lse(scores)
        probs = probs.to(scores.dtype)
    else:
        probs = torch.softmax(scores, dim=-1)
    if meta.want_scores:
        meta.scores.setdefault(layer_idx, LayerScores()).decode = \
            probs.float().sum(2).transpose(0, 1)                      # (B, H, L)
    o = kv.values(probs.view(num_kv_heads * B, group, -1))            # (H*B, G, D)
    out[:B] = o.view(num_kv_heads, B, group * head_dim).transpose(0, 1).reshape(
        B, num_heads * head_dim)
    for b, ctx in offloaded.items():
        shape = (num_kv_heads, group, 1, head_dim)
        merged = _with_offloaded(q[b].view(shape), out[b].view(shape),
                                 lse_res[:, b, :, None], ctx, layer_idx)
        out[b] = merged.reshape(-1).to(out.dtype)


def softmax_lse(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last axis in fp32 and its log-sum-exp, from one fused softmax:
    the largest probability is 1/z (z = sum of exp(s - max)), so lse = max - log(p_max).
    The scores are cast first: on the CPU ``softmax(bf16, dtype=float32)`` runs several
    times slower than the cast plus an fp32 softmax (docs/combinations.md, point 2)."""
    scores = scores.float()
    probs = torch.softmax(scores, dim=-1)
    lse = scores.amax(-1) - torch.log(probs.amax(-1))
    return probs, lse


def _with_offloaded(q: torch.Tensor, o_res: torch.Tensor, lse_res: torch.Tensor, ctx,
                    layer_idx: int) -> torch.Tensor:
    """Merge resident attention (o_res (H, G, C, D), lse_res (H, G, C)) with attention
    over the paged-out keys of ``ctx``; q (H, G, C, D) pre-scaled. Returns fp32
    (H, G, C, D) and reports each page's attention mass to ``ctx``."""
    k, v = ctx.layer_kv(layer_idx)                                        # (H, Lo, D)
    o_off, lse_off, page_frac = offloaded_attention(q, k, v, ctx.page_tokens)
    lse = torch.logaddexp(lse_res, lse_off)
    w_off = torch.exp(lse_off - lse)[..., None]                           # (H, G, C, 1)
    merged = o_res.float() * torch.exp(lse_res - lse)[..., None] + o_off * w_off
    ctx.observe(layer_idx, (page_frac * w_off).sum((0, 1, 2)))
    return merged


def offloaded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        page_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unmasked attention of q (H, G, C, D), pre-scaled, over k, v (H, L, D) with L a
    multiple of ``page_tokens``. Returns the normalized output (H, G, C, D) fp32, its
    log-sum-exp (H, G, C) fp32, and the share of each query's attention that each page
    gets (H, G, C, L / page_tokens). Scores are in the compute dtype, the softmax in
    fp32 (one fused pass), queries tiled by QUERY_TILE; plain batched products over
    contiguous (H, L, D) keys, so no operand is copied to fit the BLAS layout."""
    H, G, C, D = q.shape
    L = k.shape[1]
    out = torch.empty((H, G, C, D), dtype=torch.float32, device=q.device)
    lse = torch.empty((H, G, C), dtype=torch.float32, device=q.device)
    page_frac = torch.empty((H, G, C, L // page_tokens), dtype=torch.float32,
                            device=q.device)
    for i0 in range(0, C, QUERY_TILE):
        i1 = min(C, i0 + QUERY_TILE)
        c = i1 - i0
        qt = q[:, :, i0:i1].reshape(H, G * c, D)
        scores = torch.bmm(qt, k.transpose(1, 2))                         # (H, G*c, L)
        probs, tile_lse = softmax_lse(scores)
        page_frac[:, :, i0:i1] = probs.view(H, G, c, -1, page_tokens).sum(-1)
        out[:, :, i0:i1] = torch.bmm(probs.to(v.dtype), v).view(H, G, c, D)
        lse[:, :, i0:i1] = tile_lse.view(H, G, c)
    return out, lse, page_frac


def _window_attention(qs: torch.Tensor, kc: torch.Tensor, window: int,
                      hole: tuple[int, int] | None = None,
                      front: torch.Tensor | None = None) -> torch.Tensor:
    """Attention (H, W, L) fp32 of the chunk's last W queries over all L keys, summed over
    query heads. qs (H, G, C, D) pre-scaled, kc (H, D, L); the chunk ends at key L-1.
    ``front`` (H, Lo, D): paged-out keys that precede all L (a sequence prefilled through
    the tiers): they join the softmax unmasked, and the result is (H, W, Lo + L) in
    time order -- the scores one resident sequence of Lo + L keys would give."""
    H, G, C, D = qs.shape
    w = min(window, C)
    L = kc.shape[-1]
    qw = qs[:, :, C - w:].float()
    scores = torch.matmul(qw, kc[:, None].float())                         # (H, G, w, L)
    q_pos = torch.arange(L - w, L, device=qs.device)
    scores.masked_fill_(torch.arange(L, device=qs.device)[None, :] > q_pos[:, None], NEG_INF)
    if hole is not None:
        scores[..., hole[0]:hole[1]] = NEG_INF
    if front is not None:
        front_scores = torch.matmul(qw, front.transpose(1, 2)[:, None].float())  # (H,G,w,Lo)
        scores = torch.cat([front_scores, scores], dim=-1)
    return torch.softmax(scores, dim=-1).sum(1)


def _causal_chunk(qs: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                  num_past: int, acc: torch.Tensor | None = None,
                  lse: torch.Tensor | None = None,
                  hole: tuple[int, int] | None = None,
                  window: int | None = None) -> torch.Tensor:
    """Causal attention of C queries that follow ``num_past`` cached keys.

    qs (H, G, C, D) pre-scaled; kc (H, D, L); vc (H, L, D); L = num_past + C.
    Query i (absolute index num_past + i) sees keys 0 .. num_past + i. Queries are
    tiled so that a tile [i0, i1) multiplies only keys [0, num_past + i1), and only the
    tile's diagonal square needs a mask:

        keys ->   |<----- num_past ----->|<-- chunk -->|
        tile 0    ######################  #\
        tile 1    ######################  ####\

    Scores stay in the compute dtype; softmax accumulates in fp32 internally (as HF's
    eager attention does: bf16 scores, fp32 softmax, bf16 probabilities). With ``acc``
    (H, L), the attention each key receives (summed over queries and query heads) is
    added to it. With ``lse`` (H, G, C) fp32, each query's log-sum-exp of its scores is
    written there (for merging with attention over paged-out keys). Keys in ``hole``
    (first, end), a slot range of the past, are masked out. With ``window`` W, query i
    also sees no key before num_past + i - W + 1: a tile reads keys from its first
    query's first visible key on, and masks the band below the diagonal as well.
    """
    H, G, C, D = qs.shape
    out = torch.empty_like(qs)
    tile = min(QUERY_TILE, C)
    diag = torch.full((tile, tile), NEG_INF, device=qs.device).triu_(1).to(qs.dtype)
    for i0 in range(0, C, tile):
        i1 = min(C, i0 + tile)
        c, n_keys = i1 - i0, num_past + i1
        k0 = 0 if window is None else max(0, num_past + i0 - window + 1)  # first key read
        qt = qs[:, :, i0:i1].reshape(H, G * c, D)
        scores = torch.bmm(qt, kc[:, :, k0:n_keys]).view(H, G, c, n_keys - k0)
        scores[..., num_past + i0 - k0:] += diag[:c, :c]
        if window is not None:            # key j hidden from query q when j <= q - W
            q_pos = torch.arange(num_past + i0, n_keys, device=qs.device)
            k_pos = torch.arange(k0, n_keys, device=qs.device)
            scores.masked_fill_(k_pos[None, :] <= q_pos[:, None] - window, NEG_INF)
        if hole is not None:
            scores[..., max(0, hole[0] - k0):max(0, hole[1] - k0)] = NEG_INF
        if lse is None:
            probs = torch.softmax(scores, dim=-1).view(H, G * c, n_keys - k0)
        else:
            probs, lse[:, :, i0:i1] = softmax_lse(scores)
            probs = probs.to(qs.dtype).view(H, G * c, n_keys - k0)
        if acc is not None:
            acc[:, k0:n_keys] += probs.float().sum(1)
        out[:, :, i0:i1] = torch.bmm(probs, vc[:, k0:n_keys]).view(H, G, c, D)
    return out
