"""Unquantized baselines: ``fp32``, ``bf16``, ``fp16`` -- K and V stored as they are."""
from __future__ import annotations

from typing import ClassVar

import torch

from kvmap.kv.codecs.base import CODECS, Codec, LayerStore, gather_blocks
from kvmap.kv.codecs.rows import HeadRows
from kvmap.kv.spec import KVGeometry


class PlainCodec(Codec):
    """Stores K and V in ``storage_dtype``; read casts to the compute dtype."""

    storage_dtype: ClassVar[torch.dtype]

    def allocate(self, num_blocks: int, geom: KVGeometry, device, compute_dtype,
                 layer_id: int | None = None) -> LayerStore:
        shape = (num_blocks, geom.block_size, geom.num_kv_heads, geom.head_dim)
        return LayerStore({
            "k": torch.zeros(shape, dtype=self.storage_dtype, device=device),
            "v": torch.zeros(shape, dtype=self.storage_dtype, device=device),
        }, state={"compute_dtype": compute_dtype})

    def write(self, store: LayerStore, slot_ids: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        # (num_blocks, block_size, H, D) viewed as (num_slots, H, D); slot = block*bs + offset
        kf = store.blocks["k"].view(-1, *store.blocks["k"].shape[2:])
        vf = store.blocks["v"].view(-1, *store.blocks["v"].shape[2:])
        kf.index_copy_(0, slot_ids, k.to(self.storage_dtype))
        vf.index_copy_(0, slot_ids, v.to(self.storage_dtype))

    def read(self, store: LayerStore, block_ids: torch.Tensor):
        k = gather_blocks(store.blocks["k"], block_ids)
        v = gather_blocks(store.blocks["v"], block_ids)
        dtype = store.state["compute_dtype"]
        return k.to(dtype), v.to(dtype)   # no copy when storage dtype == compute dtype

    def read_rows(self, store: LayerStore, rows: HeadRows):
        dtype = store.state["compute_dtype"]
        return (rows.gather(store.blocks["k"]).to(dtype),
                rows.gather(store.blocks["v"]).to(dtype))


@CODECS.register
class FP32(PlainCodec):
    name = "fp32"
    storage_dtype = torch.float32


@CODECS.register
class BF16(PlainCodec):
    name = "bf16"
    storage_dtype = torch.bfloat16


@CODECS.register
class FP16(PlainCodec):
    name = "fp16"
    storage_dtype = torch.float16
