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

Masks are built once per step (``AttentionMetadata``) and shared by all layers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvmap.kv.codecs import Codec, LayerStore

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
class AttentionMetadata:
    slot_ids: torch.Tensor                   # (T,) where each new token's K/V is written
    num_decode: int = 0
    decode_block_ids: torch.Tensor | None = None   # (B, nb) padded block tables
    decode_mask: torch.Tensor | None = None        # (1, B, 1, nb*bs) additive, 0 or -inf
    prefills: list[PrefillSegment] = field(default_factory=list)
    # Attention statistics for a selection policy (kvmap.kv.policies), per layer:
    #   scores[layer]["decode"]          (B, H, L) fp32, the decode queries' attention
    #   scores[layer]["window"][i]       (H, W, L_i) fp32, last W queries of prefill i
    #   scores[layer]["accumulated"][i]  (H, L_i) fp32, attention received from chunk i
    # (summed over the query heads of each KV head). Only segments that complete
    # their prompt get a window.
    want_scores: bool = False
    observation_window: int = 1
    accumulate: bool = False
    scores: dict = field(default_factory=dict)

    @classmethod
    def build(cls, slot_ids: torch.Tensor, decode_tables: list[list[int]],
              decode_kv_lens: list[int], prefills: list[PrefillSegment], block_size: int,
              device, dtype: torch.dtype = torch.float32) -> "AttentionMetadata":
        meta = cls(slot_ids=slot_ids, num_decode=len(decode_tables), prefills=prefills)
        if decode_tables:
            nb = max(len(t) for t in decode_tables)
            padded = [t + [t[0]] * (nb - len(t)) for t in decode_tables]  # pad: masked out
            meta.decode_block_ids = torch.tensor(padded, dtype=torch.long, device=device)
            lens = torch.tensor(decode_kv_lens, device=device)
            key_idx = torch.arange(nb * block_size, device=device)
            visible = key_idx[None, :] < lens[:, None]                     # (B, L)
            mask = torch.zeros(visible.shape, dtype=torch.float32, device=device)
            meta.decode_mask = mask.masked_fill_(~visible, NEG_INF)[None, :, None, :].to(dtype)
        return meta


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, store: LayerStore,
                    codec: Codec, meta: AttentionMetadata, num_kv_heads: int,
                    layer_idx: int = 0) -> torch.Tensor:
    """q: (T, Hq, D), k/v: (T, Hkv, D) with rotary already applied. Returns (T, Hq*D).
    Mutates ``store`` (writes k, v at ``meta.slot_ids``)."""
    T, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    codec.write(store, meta.slot_ids, k, v)
    q = q * head_dim ** -0.5
    out = torch.empty((T, num_heads * head_dim), dtype=q.dtype, device=q.device)
    B = meta.num_decode
    if B:
        # (B*nb, bs, H, D) -> batch over (H, B): (H*B, L, D), the layout bmm wants
        kc, vc = codec.read(store, meta.decode_block_ids.reshape(-1))
        kc = kc.view(B, -1, num_kv_heads, head_dim).permute(2, 0, 1, 3).reshape(
            num_kv_heads * B, -1, head_dim)
        vc = vc.view(B, -1, num_kv_heads, head_dim).permute(2, 0, 1, 3).reshape(
            num_kv_heads * B, -1, head_dim)
        qd = q[:B].view(B, num_kv_heads, group, head_dim).transpose(0, 1).reshape(
            num_kv_heads * B, group, head_dim)                            # (H*B, G, D)
        scores = torch.bmm(qd, kc.transpose(1, 2)).view(num_kv_heads, B, group, -1)
        scores += meta.decode_mask                                        # (H, B, G, L)
        probs = torch.softmax(scores, dim=-1)
        if meta.want_scores:
            stats = meta.scores.setdefault(layer_idx, {"window": {}, "accumulated": {}})
            stats["decode"] = probs.float().sum(2).transpose(0, 1)        # (B, H, L)
        o = torch.bmm(probs.view(num_kv_heads * B, group, -1), vc)        # (H*B, G, D)
        out[:B] = o.view(num_kv_heads, B, group * head_dim).transpose(0, 1).reshape(
            B, num_heads * head_dim)
    for i, seg in enumerate(meta.prefills):
        kc, vc = codec.read(store, seg.block_ids)                         # (nb, bs, H, D)
        L = seg.num_kv_slots
        kc = kc.reshape(-1, num_kv_heads, head_dim)[:L].permute(1, 2, 0)  # (H, D, L)
        vc = vc.reshape(-1, num_kv_heads, head_dim)[:L].transpose(0, 1)   # (H, L, D)
        C = seg.end - seg.start
        qs = q[seg.start:seg.end].view(C, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        acc = None
        if meta.want_scores:
            stats = meta.scores.setdefault(layer_idx, {"window": {}, "accumulated": {}})
            if meta.accumulate:
                acc = stats["accumulated"][i] = torch.zeros(num_kv_heads, L)
            if seg.completes_prompt:
                stats["window"][i] = _window_attention(qs, kc, meta.observation_window)
        o = _causal_chunk(qs, kc, vc, L - C, acc)                         # (H, G, C, D)
        out[seg.start:seg.end] = o.permute(2, 0, 1, 3).reshape(C, num_heads * head_dim)
    return out


def _window_attention(qs: torch.Tensor, kc: torch.Tensor, window: int) -> torch.Tensor:
    """Attention (H, W, L) fp32 of the chunk's last W queries over all L keys, summed over
    query heads. qs (H, G, C, D) pre-scaled, kc (H, D, L); the chunk ends at key L-1."""
    H, G, C, D = qs.shape
    w = min(window, C)
    L = kc.shape[-1]
    scores = torch.matmul(qs[:, :, C - w:].float(), kc[:, None].float())   # (H, G, w, L)
    q_pos = torch.arange(L - w, L)
    scores.masked_fill_(torch.arange(L)[None, :] > q_pos[:, None], NEG_INF)
    return torch.softmax(scores, dim=-1).sum(1)


def _causal_chunk(qs: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                  num_past: int, acc: torch.Tensor | None = None) -> torch.Tensor:
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
    added to it.
    """
    H, G, C, D = qs.shape
    out = torch.empty_like(qs)
    tile = min(QUERY_TILE, C)
    diag = torch.full((tile, tile), NEG_INF, device=qs.device).triu_(1).to(qs.dtype)
    for i0 in range(0, C, tile):
        i1 = min(C, i0 + tile)
        c, n_keys = i1 - i0, num_past + i1
        qt = qs[:, :, i0:i1].reshape(H, G * c, D)
        scores = torch.bmm(qt, kc[:, :, :n_keys]).view(H, G, c, n_keys)
        scores[..., num_past + i0:n_keys] += diag[:c, :c]
        probs = torch.softmax(scores, dim=-1).view(H, G * c, n_keys)
        if acc is not None:
            acc[:, :n_keys] += probs.float().sum(1)
        out[:, :, i0:i1] = torch.bmm(probs, vc[:, :n_keys]).view(H, G, c, D)
    return out
