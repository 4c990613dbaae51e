"""Page frames: one layer of a run of pool blocks as one ``serde`` frame.

Paging a context larger than the pool (``pager.py``) moves a sequence's cold blocks out
in *pages* of ``page_blocks`` consecutive full blocks, and writes each page one frame
per layer, so that attention can fetch layer l's K/V of a page alone::

    key  "page/<seq>/<page>/<layer>"
    frame  serde frame with one entry: {name: tensor (page_blocks, ...)} in a codec

A level whose codec is the pool's holds the pool's tensors bit for bit; another codec
(``disk_codec=int4``) re-encodes K and V through a scratch store of that codec, as
``frames.py`` does for whole blocks. Reading a frame back gives K and V of the page,
``(page_blocks * block_size, num_kv_heads, head_dim)`` in the compute dtype, checked
first (CRC unless the tier just did, then names, dtypes and shapes).

Thread use: :meth:`encode` and :meth:`transcode` run on the engine thread only; every
scratch store is allocated in the constructor, so :meth:`decode_kv` (the prefetch
thread) only reads shared state and builds its own tensors.
"""
from __future__ import annotations

import torch

from kvmap.kv.cache import PagedKVCache
from kvmap.kv.codecs import Codec, LayerStore
from kvmap.kv.tiers import serde
from kvmap.kv.offload.frames import FrameMismatch, same_codec

PAGE_PREFIX = "page/"


def page_key(seq_uid: int, page: int, layer: int) -> str:
    return f"{PAGE_PREFIX}{seq_uid}/{page}/{layer}"


def page_layer(key) -> int | None:
    """The layer of a page key; None for any other key (a prefix hash)."""
    if isinstance(key, str) and key.startswith(PAGE_PREFIX):
        return int(key.rsplit("/", 1)[1])
    return None


class PageFrames:
    """Page frames of one paged KV cache, for the given level codecs."""

    def __init__(self, kv: PagedKVCache, page_blocks: int, codecs: list[Codec]) -> None:
        self.kv = kv
        self.page_blocks = page_blocks
        self.page_tokens = page_blocks * kv.block_size
        self._slots = torch.arange(self.page_tokens)
        self._ids = torch.arange(page_blocks)
        # id(codec) -> per layer, a page_blocks-block CPU store (shapes, state, encoding)
        self._scratch: dict[int, list[LayerStore]] = {}
        self._frame_bytes: dict[int, int] = {}           # id(codec) -> frame length
        for codec in codecs:
            if not self.is_pool_codec(codec) and id(codec) not in self._scratch:
                self._scratch[id(codec)] = [
                    codec.allocate(page_blocks, kv.geom, "cpu", kv.compute_dtype, layer_id=i)
                    for i in range(kv.geom.num_layers)]

    def is_pool_codec(self, codec: Codec) -> bool:
        return same_codec(codec, self.kv.codec)

    def frame_bytes(self, codec: Codec) -> int:
        """Bytes of one page frame (one layer) in ``codec`` (encoded once per codec: the
        size is fixed by the shapes, and reports ask for it often)."""
        if id(codec) not in self._frame_bytes:
            self._frame_bytes[id(codec)] = len(serde.encode_block([self._template(codec, 0)]))
        return self._frame_bytes[id(codec)]

    # ---- engine thread ------------------------------------------------------------
    def encode(self, block_ids: list[int], layer: int, codec: Codec) -> bytes:
        """Pool blocks ``block_ids`` (one page, in order) of layer ``layer`` as a frame."""
        store = self.kv.layers[layer]
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.kv.device)
        if self.is_pool_codec(codec):
            return serde.encode_block([[(name, t.index_select(0, ids))
                                        for name, t in store.blocks.items()]])
        k, v = self.kv.codec.read(store, ids)                  # (P, bs, H, D)
        return self._encode_kv(codec, layer, k, v)

    def transcode(self, data: bytes, layer: int, src: Codec, dst: Codec) -> bytes:
        """A page frame of ``src`` re-encoded in ``dst``. Raises like :meth:`decode_kv`."""
        k, v = self.decode_kv(data, layer, src)
        return self._encode_kv(dst, layer, k, v)

    def _encode_kv(self, codec: Codec, layer: int, k: torch.Tensor, v: torch.Tensor) -> bytes:
        store = self._scratch[id(codec)][layer]
        H, D = k.shape[-2:]
        codec.write(store, self._slots, k.reshape(-1, H, D).cpu(), v.reshape(-1, H, D).cpu())
        return serde.encode_block([store.block_to_bytes(slice(None))])

    # ---- any thread ---------------------------------------------------------------
    def decode_kv(self, data: bytes, layer: int, codec: Codec, check_crc: bool = True):
        """K, V of a page frame, each (page_tokens, H, D) in the compute dtype on the
        pool's device. Raises serde.CorruptBlockError or FrameMismatch (ValueErrors)."""
        frame = serde.decode_block(data, check_crc=check_crc)
        if len(frame) != 1:
            raise FrameMismatch(f"page frame has {len(frame)} layers, expected 1")
        ref = self._template(codec, layer)
        tensors = frame[0]
        if list(tensors) != [name for name, _ in ref]:
            raise FrameMismatch(f"page frame tensors {list(tensors)}, expected "
                                f"{[name for name, _ in ref]}")
        for name, r in ref:
            t = tensors[name]
            if t.dtype != r.dtype or t.shape != r.shape:
                raise FrameMismatch(f"page frame {name}: {t.dtype} {tuple(t.shape)}, "
                                    f"expected {r.dtype} {tuple(r.shape)}")
        serde.check_finite(tensors.items())
        # the pool's codec reads on the pool's device with the pool's per-layer state;
        # another codec on CPU with its scratch store's state, then moves K and V
        dev = self.kv.device if self.is_pool_codec(codec) else torch.device("cpu")
        store = LayerStore({n: t.to(dev) for n, t in tensors.items()},
                           self._like(codec, layer).state)
        k, v = codec.read(store, self._ids.to(dev))               # (P, bs, H, D)
        H, D = k.shape[-2:]
        return (k.reshape(-1, H, D).to(self.kv.device), v.reshape(-1, H, D).to(self.kv.device))

    def _like(self, codec: Codec, layer: int) -> LayerStore:
        return (self.kv.layers[layer] if self.is_pool_codec(codec)
                else self._scratch[id(codec)][layer])

    def _template(self, codec: Codec, layer: int) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor of a page's shape and dtype) of what a frame of ``codec`` holds."""
        like = self._like(codec, layer)
        return [(name, t.new_empty((self.page_blocks,) + tuple(t.shape[1:]), device="cpu"))
                for name, t in like.blocks.items()]
