"""KIVI: ``kivi(bits=2|4, group_size=32, residual=128)``.

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
always rounded once from exact values. With residual > 0 each block carries
full-precision copies k.fp, v.fp (nb, bs, H, D) in the compute dtype (resident for
every block and counted in ``block_bytes``: this KIVI saves no memory, it measures the
quality of KIVI's scheme; a residual-sized staging pool is future work), and:

    full (nb,) bool        the block's last offset is written
    t0   (nb,) int64       the write time of the block's offset 0 token
    state["clock"]         the layer's write time, advanced by every write call

The codec does not know which sequence a block belongs to, so token age is measured on
a clock: within a write call, a *run* is a stretch of consecutive slots (slot + 1, or
the last offset of a block then offset 0 of another: one sequence's chunk); token i of
a run is written at time clock + i + 1, and the call advances the clock by its longest
run. A sequence's age estimate of a token is then never below its true age (another
sequence's longer chunk in the same call advances everyone's clock), so no token stays
exact longer than in KIVI. A block is read exactly while it is not full or its oldest
token is younger than R (clock - t0 < R): between R - bs + 1 and R newest tokens of a
decoding sequence are exact. Prefill chunks attend to the older part of their prompt
through the codes (KIVI's prefill attends in full precision), which only matters for
scoring prompts, not for decoding after them.

With residual = 0 nothing is staged: keys of a partial block are re-encoded from their
codes as the block fills (see block_quant.py), values are quantized at once.
"""
from __future__ import annotations

import torch

from kvmap.kv.codecs.base import CODECS, LayerStore
from kvmap.kv.codecs.block_quant import BlockQuant
from kvmap.kv.codecs.quant import IntGrid
from kvmap.kv.codecs.quantizers import SlotQuant, TensorQuant, flat_slots
from kvmap.kv.codecs.scaled import QuantCodec


@CODECS.register
class KIVI(QuantCodec):
    name = "kivi"
    defaults = {"bits": 2, "group_size": None, "residual": 128}   # group_size: as int4's

    def validate(self) -> None:
        o = self.options
        if o["bits"] not in (2, 4):
            raise ValueError(f"codec 'kivi': bits={o['bits']!r} must be 2 or 4")
        r = o["residual"]
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise ValueError(f"codec 'kivi': residual={r!r} must be a non-negative integer")
        super().validate()

    def quantizers(self) -> dict[str, TensorQuant]:
        grid = IntGrid(self.options["bits"], symmetric=False)
        return {"k": BlockQuant("k", grid, symmetric=False,
                                staging=self.options["residual"] > 0),
                "v": SlotQuant("v", grid, False, "group", self.options["group_size"])}


    # ---- the residual window (module docstring) -----------------------------------------
    def allocate(self, num_blocks, geom, device, compute_dtype, layer_id=None) -> LayerStore:
        store = super().allocate(num_blocks, geom, device, compute_dtype, layer_id)
        if self.options["residual"]:
            store.blocks["v.fp"] = torch.zeros(
                (num_blocks, geom.block_size, geom.num_kv_heads, geom.head_dim),
                dtype=compute_dtype, device=device)
            store.blocks["t0"] = torch.zeros(num_blocks, dtype=torch.int64, device=device)
            store.state["clock"] = 0
        return store

    def write(self, store: LayerStore, slot_ids: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        super().write(store, slot_ids, k, v)            # k.fp, k.full: BlockQuant staging
        if not self.options["residual"]:
            return
        blocks = store.blocks
        flat_slots(blocks["v.fp"]).index_copy_(0, slot_ids, v.to(blocks["v.fp"].dtype))
        times, longest = run_times(slot_ids, blocks["k.q"].shape[1])
        first = slot_ids % blocks["k.q"].shape[1] == 0
        bs = blocks["k.q"].shape[1]
        blocks["t0"].index_copy_(0, slot_ids[first] // bs, times[first] + store.state["clock"])
        store.state["clock"] += longest

    def exact_blocks(self, store: LayerStore, block_ids: torch.Tensor) -> torch.Tensor:
        """(N,) bool: blocks read in full precision (partial, or all tokens younger than R)."""
        full = store.blocks["k.full"].index_select(0, block_ids)
        age = store.state["clock"] - store.blocks["t0"].index_select(0, block_ids)
        return ~full | (age < self.options["residual"])

    def read(self, store: LayerStore, block_ids: torch.Tensor):
        k, v = super().read(store, block_ids)
        if not self.options["residual"]:
            return k, v
        exact = self.exact_blocks(store, block_ids)[:, None, None, None]
        k_fp = store.blocks["k.fp"].index_select(0, block_ids).to(k.dtype)
        v_fp = store.blocks["v.fp"].index_select(0, block_ids).to(v.dtype)
        return torch.where(exact, k_fp, k), torch.where(exact, v_fp, v)


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
