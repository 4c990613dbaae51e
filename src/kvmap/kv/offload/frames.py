"""Pool blocks <-> serde frames, in the pool's codec or another one.

A pool block is, in every layer, the block's slice of that layer's ``LayerStore``
tensors in the pool's codec. A tier level may keep blocks in another codec
(``disk_codec=int4``); converting goes through K and V in the compute dtype, in
one-block CPU scratch stores, one per layer (a static-scale codec's ranges are per layer)::

    codec A tensors --A.read--> k, v (bs, H, D) --B.write--> codec B tensors

When a level's codec is the pool's, a frame holds the pool's tensors bit for bit. Every
frame read back is checked before use: CRC (``serde.decode_block``), then layer count,
tensor names, dtypes and shapes against what the codec stores (:class:`FrameMismatch`),
then every floating tensor for NaN and inf (``serde.check_finite``).
"""
from __future__ import annotations

import torch

from kvmap.kv.cache import PagedKVCache
from kvmap.kv.codecs import Codec, LayerStore
from kvmap.kv.tiers import serde

Frame = list[dict[str, torch.Tensor]]   # a decoded block: per layer, name -> tensor


class FrameMismatch(ValueError):
    """An intact frame whose tensors are not the layout the codec stores."""


def same_codec(a: Codec, b: Codec) -> bool:
    return a is b or (type(a) is type(b) and a.options == b.options)


class BlockFrames:
    """Frames of the blocks of one paged KV cache. Not thread-safe (shared scratch)."""

    def __init__(self, kv: PagedKVCache) -> None:
        self.kv = kv
        self._scratch: dict[int, list[LayerStore]] = {}   # id(codec) -> one-block stores
        self._zero_ids = torch.zeros(1, dtype=torch.long)
        self._block_slots = torch.arange(kv.block_size)

    def is_pool_codec(self, codec: Codec) -> bool:
        return same_codec(codec, self.kv.codec)

    def frame_bytes(self, codec: Codec) -> int:
        """Bytes of one block's frame in ``codec`` (all blocks of a codec weigh the same)."""
        return len(serde.encode_block([s.block_to_bytes(0) for s in self._like(codec)]))

    def encode_pool_block(self, block_id: int, codec: Codec) -> bytes:
        """Pool block ``block_id``, all layers, as a frame in ``codec``."""
        if self.is_pool_codec(codec):
            return serde.encode_block([s.block_to_bytes(block_id) for s in self.kv.layers])
        ids = torch.tensor([block_id], dtype=torch.long, device=self.kv.device)
        out = []
        for layer, store in enumerate(self.kv.layers):
            k, v = self.kv.codec.read(store, ids)            # (1, bs, H, D) compute dtype
            out.append(self._encode_kv(codec, layer, k[0], v[0]))
        return serde.encode_block(out)

    def decode(self, data: bytes, codec: Codec) -> Frame:
        """A checked frame of ``codec``. Raises serde.CorruptBlockError or FrameMismatch
        (both ValueErrors)."""
        frame = serde.decode_block(data)
        like = self._like(codec)
        if len(frame) != len(like):
            raise FrameMismatch(f"frame has {len(frame)} layers, the model {len(like)}")
        for layer, (tensors, store) in enumerate(zip(frame, like)):
            if list(tensors) != list(store.blocks):
                raise FrameMismatch(f"layer {layer}: tensors {list(tensors)}, expected "
                                    f"{list(store.blocks)}")
            for name, t in tensors.items():
                ref = store.blocks[name]
                if t.dtype != ref.dtype or t.shape != ref.shape[1:]:
                    raise FrameMismatch(f"layer {layer} {name}: {t.dtype} {tuple(t.shape)},"
                                        f" expected {ref.dtype} {tuple(ref.shape[1:])}")
            serde.check_finite(tensors.items())
        return frame

    def write_pool_block(self, block_id: int, frame: Frame, codec: Codec) -> None:
        """Copy a checked frame of ``codec`` into pool block ``block_id``, every layer."""
        if self.is_pool_codec(codec):
            for store, tensors in zip(self.kv.layers, frame):
                for name, t in tensors.items():
                    store.blocks[name][block_id].copy_(t)   # host -> device if needed
            return
        dev = self.kv.device
        slots = (block_id * self.kv.block_size + self._block_slots).to(dev)
        for layer, store in enumerate(self.kv.layers):
            k, v = self._frame_kv(frame, codec, layer)
            self.kv.codec.write(store, slots, k.to(dev), v.to(dev))

    def transcode(self, frame: Frame, src: Codec, dst: Codec) -> bytes:
        """A checked frame of ``src`` re-encoded as a frame of ``dst``."""
        return serde.encode_block([self._encode_kv(dst, layer, *self._frame_kv(frame, src, layer))
                                   for layer in range(len(frame))])

    # ---- scratch ------------------------------------------------------------------------
    def _like(self, codec: Codec) -> list[LayerStore]:
        """Stores whose block tensors show what a frame of ``codec`` holds."""
        return self.kv.layers if self.is_pool_codec(codec) else self._scratch_of(codec)

    def _scratch_of(self, codec: Codec) -> list[LayerStore]:
        stores = self._scratch.get(id(codec))
        if stores is None:
            geom, dtype = self.kv.geom, self.kv.compute_dtype
            stores = [codec.allocate(1, geom, "cpu", dtype, layer_id=layer)
                      for layer in range(geom.num_layers)]
            self._scratch[id(codec)] = stores
        return stores

    def _encode_kv(self, codec: Codec, layer: int, k: torch.Tensor, v: torch.Tensor):
        """k, v (bs, H, D) of one layer -> that layer's block tensors in ``codec`` (views
        of the scratch store, valid until its next write)."""
        store = self._scratch_of(codec)[layer]
        codec.write(store, self._block_slots, k.cpu(), v.cpu())
        return store.block_to_bytes(0)

    def _frame_kv(self, frame: Frame, codec: Codec, layer: int):
        """Layer ``layer`` of a checked frame of ``codec`` -> (k, v), each (bs, H, D)."""
        store = self._scratch_of(codec)[layer]
        for name, t in frame[layer].items():
            store.blocks[name][0].copy_(t)
        k, v = codec.read(store, self._zero_ids)
        return k[0], v[0]
