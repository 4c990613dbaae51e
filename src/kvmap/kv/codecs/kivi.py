"""KIVI: ``kivi(bits=2|4, group_size=32, residual=128, staging_seqs=64)``.

Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache".
Keys have outlier *channels*, so KIVI quantizes keys per channel (grouping tokens) and
values per token (grouping channels), both asymmetric (min/max), and keeps the most
recent ``residual`` tokens in full precision until a token group fills.

Mapping onto paged blocks (bs = block_size):

    keys    per channel, the token group is the block    (block_quant.py)
            k.q (nb, bs, H, D*bits/8) uint8, k.r / k.z (nb, H, D) fp16
    values  per token, groups of ``group_size`` channels (quantizers.SlotQuant; default
            32, or gcd(32, head_dim))
            v.q (nb, bs, H, D*bits/8) uint8, v.r / v.z (nb, bs, H, D/group_size) fp16

``residual`` -- KIVI's R: the most recent R tokens of each sequence, keys *and* values,
are read back in full precision; older tokens are read from their codes. Codes are
always rounded once from exact values. With residual > 0 the exact K/V live in a
staging pool (staging.py) of ceil(R / bs) blocks per running sequence
(``staging_seqs``, default 16; capped at the pool's blocks), allocated once per layer,
counted in the resident bytes and paid from the pool's byte budget, and recycled as
blocks age into codes. More running sequences than ``staging_seqs`` share the rows:
the least recently written are evicted and read their codes (quality, never memory,
pays). Per block:

    full  (nb,) bool       the block's last offset is written
    t0    (nb,) int64      the write time of the block's offset 0 token
    stage (nb,) int64      its staging row's assignment id (staging.py)
    state["clock"]         the layer's write time, advanced by every write call

The codec does not know which sequence a block belongs to, so token age is measured on
a clock: within a write call, a *run* is a stretch of consecutive slots (slot + 1, or
the last offset of a block then offset 0 of another: one sequence's chunk); token i of
a run is written at time clock + i + 1, and the call advances the clock by its longest
run. A sequence's age estimate of a token is then never below its true age (another
sequence's longer chunk in the same call advances everyone's clock), so no token stays
exact longer than in KIVI. A block is read exactly while it is not full or its oldest
token is younger than R (clock - t0 < R) and its staging row survives: between
R - bs + 1 and R newest tokens of a decoding sequence are exact. Prefill chunks attend
to the older part of their prompt through the codes (KIVI's prefill attends in full
precision), which only matters for scoring prompts, not for decoding after them.

With residual = 0 nothing is staged: keys of a partial block are re-encoded from their
codes as the block fills (see block_quant.py), values are quantized at once.
"""
from __future__ import annotations

import torch

from kvmap.kv.codecs import staging
from kvmap.kv.codecs.base import CODECS, LayerStore
from kvmap.kv.codecs.block_quant import BlockQuant
from kvmap.kv.codecs.quant import IntGrid
from kvmap.kv.codecs.quantizers import SlotQuant, TensorQuant
from kvmap.kv.codecs.scaled import QuantCodec


@CODECS.register
class KIVI(QuantCodec):
    name = "kivi"
    defaults = {"bits": 2, "group_size": None, "residual": 128,   # group_size: as int4's
                "staging_seqs": 16}        # sequences whose residual window is staged

    def validate(self) -> None:
        o = self.options
        if o["bits"] not in (2, 4):
            raise ValueError(f"codec 'kivi': bits={o['bits']!r} must be 2 or 4")
        r = o["residual"]
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise ValueError(f"codec 'kivi': residual={r!r} must be a non-negative integer")
        n = o["staging_seqs"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"codec 'kivi': staging_seqs={n!r} must be a positive integer")
        super().validate()

    def quantizers(self) -> dict[str, TensorQuant]:
        grid = IntGrid(self.options["bits"], symmetric=False)
        return {"k": BlockQuant("k", grid, symmetric=False,
                                staging=self.options["residual"] > 0),
                "v": SlotQuant("v", grid, False, "group", self.options["group_size"])}


    # ---- the residual window (module docstring) -----------------------------------------
    def staging_rows(self, num_blocks: int, block_size: int) -> int:
        o = self.options
        return staging.num_rows(num_blocks, block_size, o["residual"], o["staging_seqs"]) \
            if o["residual"] else 0

    def allocate(self, num_blocks, geom, device, compute_dtype, layer_id=None) -> LayerStore:
        store = super().allocate(num_blocks, geom, device, compute_dtype, layer_id)
        if self.options["residual"]:
            store.blocks["t0"] = torch.zeros(num_blocks, dtype=torch.int64, device=device)
            store.state["clock"] = 0
            staging.allocate(store, self.staging_rows(num_blocks, geom.block_size), geom,
                             device, compute_dtype)
        return store

    def staging_bytes_per_seq(self, geom, compute_dtype=torch.bfloat16) -> int:
        """ceil(R / bs) staging rows per layer (the exact blocks of one sequence)."""
        if not self.options["residual"]:
            return 0
        store = self.allocate(1, geom, "meta", compute_dtype)
        rows = staging.rows_per_seq(geom.block_size, self.options["residual"])
        return store.staging_bytes() * rows * geom.num_layers   # a 1-block cache: 1 row

    def write(self, store: LayerStore, slot_ids: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        if not self.options["residual"]:
            return super().write(store, slot_ids, k, v)
        blocks, bs = store.blocks, store.blocks["k.q"].shape[1]
        times, longest = run_times(slot_ids, bs)
        first = slot_ids % bs == 0
        fresh = slot_ids[first] // bs                  # new content: a new staging row
        blocks["t0"].index_copy_(0, fresh, times[first] + store.state["clock"])
        super().write(store, slot_ids, k, v)           # keys from staged rows where valid
        staging.drop(store, fresh)
        store.state["clock"] += longest
        self.restage(store, slot_ids)
        staging.write_tokens(store, slot_ids, k, v, store.state["clock"])

    def restage(self, store: LayerStore, slot_ids: torch.Tensor) -> None:
        """Free the rows of blocks no longer exact; give the written blocks that are exact
        a row (filled from their codes: a fresh block's tokens are all written next)."""
        st = store.state["staging"]
        owned = st["sid"] >= 0
        aged = ~self.exact_blocks(store, st["owner"].clamp(min=0))
        staging.release(store, owned & aged)
        touched = torch.unique(slot_ids // store.blocks["k.q"].shape[1])
        _, valid = staging.rows_of(store, touched)
        need = self.exact_blocks(store, touched) & ~valid
        if bool(need.any()):
            blocks = touched[need]
            blocks = blocks[staging.assign(store, blocks, protect=touched)]
            if blocks.numel():                   # none when every row is protected
                k, v = super().read(store, blocks)
                staging.write_rows(store, blocks, k, v)

    def exact_blocks(self, store: LayerStore, block_ids: torch.Tensor) -> torch.Tensor:
        """(N,) bool: blocks KIVI reads in full precision (partial, or all tokens younger
        than R), whether or not their staging row survived."""
        full = store.blocks["k.full"].index_select(0, block_ids)
        age = store.state["clock"] - store.blocks["t0"].index_select(0, block_ids)
        return ~full | (age < self.options["residual"])

    def read(self, store: LayerStore, block_ids: torch.Tensor):
        k, v = super().read(store, block_ids)
        if not self.options["residual"]:
            return k, v
        k_fp, valid = staging.gather(store, "k", block_ids)
        v_fp, _ = staging.gather(store, "v", block_ids)
        exact = (valid & self.exact_blocks(store, block_ids))[:, None, None, None]
        return torch.where(exact, k_fp.to(k.dtype), k), torch.where(exact, v_fp.to(v.dtype), v)


def run_times(slot_ids: torch.Tensor, block_size: int) -> tuple[torch.Tensor, int]:
    """Times 1, 2, ... of each written token within its run of consecutive slots (one
    sequence's chunk), and the longest run. Consecutive: slot + 1 in the same block, or
    the last offset of a block followed by offset 0 of another.

        slots   40 41 42 | 7 | 16 17      (block_size 8: 40..42 in block 5)
        times    1  2  3 | 1 |  1  2      longest 3
    """
    T = slot_ids.shape[0]
    if T == 0:
        return slot_ids.new_zeros(0), 0
    off = slot_ids % block_size
    follows = torch.zeros(T, dtype=torch.bool, device=slot_ids.device)
    follows[1:] = (((slot_ids[1:] == slot_ids[:-1] + 1) & (off[1:] != 0))
                   | ((off[:-1] == block_size - 1) & (off[1:] == 0)))
    idx = torch.arange(T, device=slot_ids.device)
    start = torch.where(follows, 0, idx).cummax(0).values       # index of the run's start
    times = idx - start + 1
    return times, int(times.max())
