"""KIVI's residual window: a small pool of full-precision blocks, recycled as blocks age.

Only the blocks read exactly (KIVI's newest ``residual`` tokens: kivi.py) need their
exact K/V, so each layer keeps a staging pool of ``S`` block-sized rows instead of a
full-precision copy of every block:

    state["staging"]["k"], ["v"]  (S, bs, H, D) compute dtype   exact K/V of staged blocks
                    ["sid"]       (S,) int64   the assignment a row holds, -1 when free
                    ["owner"]     (S,) int64   the block it was assigned to
                    ["t1"]        (S,) int64   last write time (least recently written
                                               rows are evicted first)
    blocks["stage"]               (nb,) int64  the block's assignment id, -1 for none

An assignment id ``sid = n * S + row`` is unique, so a block's row is valid only while
``state["staging"]["sid"][sid % S] == sid``. Block contents copied elsewhere (a lower
tier and back, ``copy_blocks``) carry the id: they find their exact rows while those
rows still hold that content and the codes otherwise, never another block's rows. A
write at offset 0 starts new content and takes a new assignment.

S is sized for ``seqs`` running sequences of ``ceil(residual / bs)`` exact blocks each
(capped at the pool's blocks); when more blocks need staging than S holds, the
least recently written rows are evicted and their blocks read their codes (rounded once
from exact values), which only costs quality.
"""
from __future__ import annotations

import torch

from kvmap.kv.codecs.base import LayerStore
from kvmap.kv.codecs.quantizers import flat_slots
from kvmap.kv.spec import KVGeometry


def rows_per_seq(block_size: int, residual: int) -> int:
    """A sequence's exact blocks: its newest tokens, at most ``residual`` of them, in
    whole blocks (f full ones and j tokens of a partial one, f * bs + j <= R): at most
    ceil(R / bs), so many rows between the release of aged rows and the next write."""
    return -(-residual // block_size)


def num_rows(num_blocks: int, block_size: int, residual: int, seqs: int) -> int:
    """Staging rows for ``seqs`` sequences, capped at one per block."""
    return min(num_blocks, seqs * rows_per_seq(block_size, residual))


def allocate(store: LayerStore, rows: int, geom: KVGeometry, device, dtype) -> None:
    shape = (rows, geom.block_size, geom.num_kv_heads, geom.head_dim)
    store.blocks["stage"] = torch.full((store.num_blocks,), -1, dtype=torch.int64,
                                       device=device)
    store.state["staging"] = {
        "k": torch.zeros(shape, dtype=dtype, device=device),
        "v": torch.zeros(shape, dtype=dtype, device=device),
        "sid": torch.full((rows,), -1, dtype=torch.int64, device=device),
        "owner": torch.full((rows,), -1, dtype=torch.int64, device=device),
        "t1": torch.zeros(rows, dtype=torch.int64, device=device),
    }
    store.state["next_sid"] = 0


def rows_of(store: LayerStore, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) staging row of each block (0 where none) and (N,) bool whether it is valid."""
    st = store.state["staging"]
    sid = store.blocks["stage"].index_select(0, block_ids)
    row = sid.clamp(min=0) % st["sid"].shape[0]
    return row, (sid >= 0) & (st["sid"].index_select(0, row) == sid)


def gather(store: LayerStore, name: str, block_ids: torch.Tensor):
    """(N, bs, H, D) staged rows of ``name`` (k or v) of the blocks, and (N,) valid."""
    row, valid = rows_of(store, block_ids)
    return store.state["staging"][name].index_select(0, row), valid


def release(store: LayerStore, drop_rows: torch.Tensor) -> None:
    """Free the staging rows where ``drop_rows`` (S,) bool is set."""
    st = store.state["staging"]
    st["sid"].masked_fill_(drop_rows, -1)
    st["owner"].masked_fill_(drop_rows, -1)


def drop(store: LayerStore, block_ids: torch.Tensor) -> None:
    """Free the rows of ``block_ids`` (their content is being replaced)."""
    row, valid = rows_of(store, block_ids)
    rows = torch.zeros_like(store.state["staging"]["sid"], dtype=torch.bool)
    release(store, rows.index_fill_(0, row[valid], True))
    store.blocks["stage"].index_fill_(0, block_ids, -1)


def assign(store: LayerStore, block_ids: torch.Tensor, protect: torch.Tensor) -> torch.Tensor:
    """New rows for ``block_ids``: free rows first, then the least recently written ones
    not owned by ``protect`` blocks. Returns (N,) bool: which blocks got a row."""
    st = store.state["staging"]
    S, n = st["sid"].shape[0], block_ids.shape[0]
    never = torch.iinfo(torch.int64).max
    prio = torch.where(st["sid"] < 0, -1, st["t1"])
    prio = prio.masked_fill(torch.isin(st["owner"], protect) & (st["sid"] >= 0), never)
    order = torch.argsort(prio, stable=True)[:n]
    order = order[prio.index_select(0, order) < never]                # rows we may take
    got = torch.zeros(n, dtype=torch.bool, device=block_ids.device)
    got[:order.shape[0]] = True
    blocks = block_ids[:order.shape[0]]
    sid = store.state["next_sid"] * S + order
    store.state["next_sid"] += 1
    st["sid"].index_copy_(0, order, sid)
    st["owner"].index_copy_(0, order, blocks)
    store.blocks["stage"].index_copy_(0, blocks, sid)
    return got


def write_rows(store: LayerStore, block_ids: torch.Tensor, rows_k: torch.Tensor,
               rows_v: torch.Tensor) -> None:
    """Set the whole staged rows of ``block_ids`` (which hold valid rows)."""
    st = store.state["staging"]
    row, _ = rows_of(store, block_ids)
    st["k"].index_copy_(0, row, rows_k.to(st["k"].dtype))
    st["v"].index_copy_(0, row, rows_v.to(st["v"].dtype))


def write_tokens(store: LayerStore, slot_ids: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, now: int) -> None:
    """Exact K/V of tokens (T, H, D) into the rows of their blocks; tokens of blocks
    without a valid row are skipped."""
    st = store.state["staging"]
    bs = st["k"].shape[1]
    row, valid = rows_of(store, slot_ids // bs)
    dst = (row * bs + slot_ids % bs)[valid]
    flat_slots(st["k"]).index_copy_(0, dst, k[valid].to(st["k"].dtype))
    flat_slots(st["v"]).index_copy_(0, dst, v[valid].to(st["v"].dtype))
    st["t1"].index_fill_(0, row[valid], now)
