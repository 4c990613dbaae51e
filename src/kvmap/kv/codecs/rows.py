"""Heads-first row indices of a decode batch: one gather lays K or V out for attention.

Decode attention wants K and V of B sequences as (H, B*L, D), heads first (one batched
product per head and sequence). The pool holds them slot-major, (num_blocks, bs, H, D)
= (num_slots * H, D) rows. Gathering blocks and then permuting is two passes over the
largest tensor of the step; gathering rows through an index built once per step is one,
and serves K, V, codes and their per-slot scales of every layer alike:

    slot(b, l) = table[b, l // bs] * bs + l % bs          l < L = nb * bs
    head_rows[h, b*L + l] = slot(b, l) * H + h            tensors with H heads per slot
    slot_rows[h, b*L + l] = slot(b, l)                    tensors with one (shared) head

A row gather of a 2-D view is one contiguous copy per row on the CPU (``gather_blocks``).

Small rows (under ``BLOCK_FIRST_BELOW`` bytes a head: int8 codes of 64 channels, int4
codes, per-slot scales) go the other way, blocks first: one gather of whole blocks
(a few KiB a row) and one permuting copy into heads-first order. A per-row copy of a
64-byte row costs what one of a 128-byte row does, so the row gather of codes saved
none of the bytes it skips, and the scales' 2-byte rows cost as many copies as K's.
Measured (``benchmarks/decode_step.py``, batch 32, 266 keys, quiet machine, two
threads): int8's step 1.29-1.31x bf16's with rows, 1.17-1.24x blocks first; bf16's
own 128-byte rows were no faster blocks first (40.5-45.7 against 40.8-42.2 ms), so
they stay rows. The two orders give the same values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

BLOCK_FIRST_BELOW = 128     # bytes per head and slot under which blocks are gathered first


@dataclass(frozen=True)
class HeadRows:
    head_rows: torch.Tensor     # (H * B * L,) int64, see the module docstring
    slot_rows: torch.Tensor     # (H * B * L,) int64
    num_heads: int
    num_seqs: int               # B
    num_keys: int               # L
    table: torch.Tensor         # (B, nb) the padded block tables the rows come from
    # row indices of stacked (2, ...) tensors (``gather_pair``), built once per step:
    # (kind, rows per half) -> index
    pair_ids: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, table: torch.Tensor, block_size: int, num_heads: int) -> "HeadRows":
        """From padded block tables (B, nb)."""
        B, nb = table.shape
        offsets = torch.arange(block_size, device=table.device)
        slots = (table[:, :, None] * block_size + offsets).reshape(1, -1)       # (1, B*L)
        heads = torch.arange(num_heads, device=table.device)[:, None]          # (H, 1)
        return cls((slots * num_heads + heads).reshape(-1),
                   slots.expand(num_heads, -1).reshape(-1), num_heads, B, nb * block_size,
                   table)

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """t (num_blocks, bs, Hp, ...) contiguous, Hp = H or 1 -> (H, B*L, ...): entry
        (h, b*L + l) is t's value at slot(b, l) and head h (head 0 when Hp == 1)."""
        Hp, rest = t.shape[2], t.shape[3:]
        if Hp not in (1, self.num_heads):
            raise ValueError(f"HeadRows.gather: {Hp} heads per slot, expected 1 or "
                             f"{self.num_heads}")
        BL = self.num_seqs * self.num_keys
        if math.prod(rest) * t.element_size() < BLOCK_FIRST_BELOW:
            blocks = t.reshape(t.shape[0], -1).index_select(0, self.table.reshape(-1))
            slot_major = blocks.view(BL, Hp, -1).transpose(0, 1)            # (Hp, B*L, R)
            if Hp == self.num_heads:
                out = slot_major.contiguous()
            else:                                     # one head shared: broadcast it
                out = torch.empty((self.num_heads, BL, slot_major.shape[-1]),
                                  dtype=t.dtype, device=t.device)
                out.copy_(slot_major)
            return out.view(self.num_heads, BL, *rest)
        idx = self.head_rows if Hp == self.num_heads else self.slot_rows
        rows = t.reshape(t.shape[0] * t.shape[1] * Hp, -1).index_select(0, idx)
        return rows.view(self.num_heads, BL, *rest)

    def gather_pair(self, t: torch.Tensor, by_block: torch.Tensor | None = None,
                    by_row: torch.Tensor | None = None) -> torch.Tensor:
        """t (2, num_blocks, bs, Hp, ...) contiguous, K's and V's tensors of one layer
        stacked (``kvmap.kv.codecs.paired``) -> (2, H, B*L, ...): ``gather`` of both
        halves, value for value, in one pass over them. ``by_block`` / ``by_row``: t's
        views (2 * num_blocks, -1) / (-1, prod(...)) if the caller keeps them (a view
        is an operator of the step too)."""
        n, bs, Hp, rest = t.shape[1], t.shape[2], t.shape[3], t.shape[4:]
        if Hp not in (1, self.num_heads):
            raise ValueError(f"HeadRows.gather_pair: {Hp} heads per slot, expected 1 or "
                             f"{self.num_heads}")
        H, BL, R = self.num_heads, self.num_seqs * self.num_keys, math.prod(rest)
        if R * t.element_size() < BLOCK_FIRST_BELOW:
            ids = self._pair_index("blocks", self.table.reshape(-1), n)
            by_block = t.view(2 * n, -1) if by_block is None else by_block
            blocks = by_block.index_select(0, ids)                # (2 * B * nb, bs*Hp*R)
            slot_major = blocks.view(2, BL, Hp, R).transpose(1, 2)    # (2, Hp, B*L, R)
            if Hp == H:
                out = slot_major.contiguous()
            else:                                     # one head shared: broadcast it
                out = torch.empty((2, H, BL, R), dtype=t.dtype, device=t.device)
                out.copy_(slot_major)
        else:
            idx = self.head_rows if Hp == H else self.slot_rows
            ids = self._pair_index("heads" if Hp == H else "slots", idx, n * bs * Hp)
            out = (t.view(-1, R) if by_row is None else by_row).index_select(0, ids)
        return out if out.dim() == 4 and len(rest) == 1 else out.view(2, H, BL, *rest)

    def _pair_index(self, kind: str, idx: torch.Tensor, per_half: int) -> torch.Tensor:
        """``idx`` then ``idx + per_half``: the same rows of both halves, cached."""
        key = (kind, per_half)
        ids = self.pair_ids.get(key)
        if ids is None:
            ids = self.pair_ids[key] = torch.cat((idx, idx + per_half))
        return ids
