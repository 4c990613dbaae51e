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
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadRows:
    head_rows: torch.Tensor     # (H * B * L,) int64, see the module docstring
    slot_rows: torch.Tensor     # (H * B * L,) int64
    num_heads: int
    num_seqs: int               # B
    num_keys: int               # L

    @classmethod
    def of(cls, table: torch.Tensor, block_size: int, num_heads: int) -> "HeadRows":
        """From padded block tables (B, nb)."""
        B, nb = table.shape
        offsets = torch.arange(block_size, device=table.device)
        slots = (table[:, :, None] * block_size + offsets).reshape(1, -1)       # (1, B*L)
        heads = torch.arange(num_heads, device=table.device)[:, None]          # (H, 1)
        return cls((slots * num_heads + heads).reshape(-1),
                   slots.expand(num_heads, -1).reshape(-1), num_heads, B, nb * block_size)

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """t (num_blocks, bs, Hp, ...) contiguous, Hp = H or 1 -> (H, B*L, ...): entry
        (h, b*L + l) is t's value at slot(b, l) and head h (head 0 when Hp == 1)."""
        Hp, rest = t.shape[2], t.shape[3:]
        if Hp not in (1, self.num_heads):
            raise ValueError(f"HeadRows.gather: {Hp} heads per slot, expected 1 or "
                             f"{self.num_heads}")
        idx = self.head_rows if Hp == self.num_heads else self.slot_rows
        rows = t.reshape(t.shape[0] * t.shape[1] * Hp, -1).index_select(0, idx)
        return rows.view(self.num_heads, self.num_seqs * self.num_keys, *rest)
