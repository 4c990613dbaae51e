"""Layer-wise prefix loads: a request's tier-held prefix is copied into the pool one
layer at a time on a background thread while the forward pass runs its prompt's rest.

The chunk after a cached prefix attends to the prefix at every layer, so its forward
pass cannot start layer l before layer l of every prefix block is in the pool -- but it
need not wait for layers l+1, l+2, ... (vLLM's KV connector ``wait_for_layer_load``,
LMCache's layer-wise pipelining)::

    loader thread   copy L0 | copy L1 | copy L2 | ...            | copy L29
    forward pass            | attn L0 | attn L1 | attn L2 | ...            | attn L29
                    ^ wait(0)  ^ wait(1)  ...

At admission (``TieredStore.take_prefix``) the frames are read and checked (CRC, and
the frame's skeleton -- header and every tensor's descriptor: layer, name, dtype,
shape -- equal to the pool codec's), pool blocks are allocated and named; only the
copies are deferred, so a load cannot fail once started. Attention calls
:meth:`LayerLoader.wait` before touching layer l (``AttentionMetadata.layer_loads``);
the runner calls :meth:`LayerLoader.finish` after the forward pass, and so does
anything else that reads block contents (demotion, paging out), so no load outlives the
step that started it.

A frame's tensors sit at the same byte offsets in every frame of one codec
(:class:`FrameLayout`), so layer l of N blocks is N slices gathered into one (N, bytes)
array and one ``index_copy_`` per tensor name, instead of N x names small copies.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch

from kvmap.hardware.omp_team import serial_executor
from kvmap.kv.tiers import serde
from kvmap.kv.offload.frames import FrameMismatch


class TensorSlot(NamedTuple):
    """Where one tensor of layer ``layer`` lies in a frame: bytes [offset, offset +
    num_bytes), relative to the layer's first byte."""

    name: str
    offset: int
    num_bytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class FrameLayout:
    """The byte layout shared by every frame of one codec, read off a reference frame
    (``serde``'s format: header, then per tensor a descriptor, its name, its shape and
    its raw bytes, layers in order)."""

    def __init__(self, reference: bytes) -> None:
        view = memoryview(reference).cast("B")
        header = serde.verify(view)
        self.num_bytes = len(view)
        skeleton = [np.arange(0, serde.HEADER_BYTES - 4)]      # the header less its CRC
        self.layer_ranges: list[tuple[int, int]] = []          # per layer [start, end)
        self.tensors: list[list[TensorSlot]] = [[] for _ in range(header.num_layers)]
        offset = serde.HEADER_BYTES
        for _ in range(header.num_tensors):
            layer, name_len, code, ndim = serde._DESC.unpack_from(view, offset)
            desc_end = offset + serde._DESC.size + name_len + 8 * ndim
            skeleton.append(np.arange(offset, desc_end))
            name = bytes(view[offset + serde._DESC.size:][:name_len]).decode()
            shape = tuple(np.frombuffer(view[desc_end - 8 * ndim:desc_end], "<u8").tolist())
            dtype = serde._DTYPES[code]
            if layer == len(self.layer_ranges):
                self.layer_ranges.append((offset, offset))
            start = self.layer_ranges[layer][0]
            num_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self.tensors[layer].append(TensorSlot(name, desc_end - start, num_bytes, dtype,
                                                  shape))
            offset = desc_end + num_bytes
            self.layer_ranges[layer] = (start, offset)
        self._skeleton = np.concatenate(skeleton)
        self._skeleton_ref = np.frombuffer(reference, np.uint8)[self._skeleton]

    def check(self, data: bytes) -> None:
        """Raise ``serde.CorruptBlockError`` (length, CRC, NaN or inf in a floating
        tensor) or ``FrameMismatch`` (another layout: layer count, names, dtypes or
        shapes) unless ``data`` is an intact frame of this layout."""
        serde.verify(data)
        if len(data) != self.num_bytes or not np.array_equal(
                np.frombuffer(data, np.uint8)[self._skeleton], self._skeleton_ref):
            raise FrameMismatch(f"frame of {len(data)} bytes does not have the layout of "
                                f"the pool's frames ({self.num_bytes} bytes)")
        view = memoryview(data).cast("B")
        serde.check_finite(
            (slot.name, torch.frombuffer(bytearray(view[start + slot.offset:][
                :slot.num_bytes]), dtype=torch.uint8).view(slot.dtype))
            for (start, _), slots in zip(self.layer_ranges, self.tensors) for slot in slots
            if slot.dtype.is_floating_point and slot.num_bytes)


class LayerLoad:
    """Copies of N checked frames into pool blocks ``block_ids``, one layer at a time.
    A frame is raw ``bytes`` of ``layout`` or an already decoded ``Frame`` (a read-ahead's:
    per layer, name -> tensor)."""

    def __init__(self, layers, layout: FrameLayout, block_ids: list[int], sources: list):
        self.layers = layers                 # the pool's LayerStores
        self.layout = layout
        self.block_ids = block_ids
        self.block_set = frozenset(block_ids)
        self.sources = sources
        self.num_done = 0                    # layers copied
        self.copy_s = 0.0                    # loader thread time
        self._cond = threading.Condition()

    def run(self) -> None:
        """Loader thread: copy every layer in order, waking waiters after each."""
        raw = [i for i, s in enumerate(self.sources) if isinstance(s, (bytes, bytearray))]
        decoded = [i for i, s in enumerate(self.sources) if not isinstance(s, (bytes, bytearray))]
        order = raw + decoded          # the rows of every gathered source, in this order
        dev = self.layers[0].blocks[next(iter(self.layers[0].blocks))].device
        ids = torch.tensor([self.block_ids[i] for i in order], dtype=torch.long, device=dev)
        try:
            for layer, store in enumerate(self.layers):
                start_s = time.perf_counter()
                self._copy_layer(layer, store, raw, decoded, ids)
                self.copy_s += time.perf_counter() - start_s
                with self._cond:
                    self.num_done = layer + 1
                    self._cond.notify_all()
        finally:
            with self._cond:            # never leave a waiter hanging
                self.num_done = len(self.layers)
                self._cond.notify_all()

    def _copy_layer(self, layer: int, store, raw: list[int], decoded: list[int],
                    ids: torch.Tensor) -> None:
        """Bytes into bytes: each pool tensor seen as (blocks, bytes) (contiguous, see
        ``PrefixLoads``), so a slice of the gathered rows needs no copy of its own, nor
        the dtype's alignment."""
        start, end = self.layout.layer_ranges[layer]
        rows = None
        if raw:        # (R, layer bytes): one gather of this layer's bytes of every frame
            joined = bytearray().join(memoryview(self.sources[i])[start:end] for i in raw)
            rows = torch.frombuffer(joined, dtype=torch.uint8).view(len(raw), end - start)
        for slot in self.layout.tensors[layer]:
            parts = [] if rows is None else [rows[:, slot.offset:slot.offset + slot.num_bytes]]
            if decoded:
                parts.append(torch.stack([self.sources[i][layer][slot.name].reshape(-1)
                                          .view(torch.uint8) for i in decoded]))
            src = parts[0] if len(parts) == 1 else torch.cat(parts)
            dst = store.blocks[slot.name]
            dst.view(torch.uint8).view(dst.shape[0], -1).index_copy_(0, ids, src.to(dst.device))

    def wait(self, layer: int) -> float:
        """Block until layer ``layer`` is copied; the seconds waited."""
        if self.num_done > layer:
            return 0.0
        start_s = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: self.num_done > layer)
        return time.perf_counter() - start_s


class LayerLoader:
    """The layer-wise loads of one tiered store: one background thread, loads run in
    the order started. Engine thread only, except :meth:`LayerLoad.run`."""

    def __init__(self, layers) -> None:
        self.layers = layers
        self._pending: list[tuple[LayerLoad, Future]] = []
        self._executor: ThreadPoolExecutor | None = serial_executor("kvmap-layer-load")
        self.wait_s = 0.0         # engine time blocked on a layer (model idle)
        self.copy_s = 0.0         # loader thread time copying, loads finished

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def loading(self, block_id: int) -> bool:
        """Whether a pending load is still to write pool block ``block_id``."""
        return any(block_id in load.block_set for load, _ in self._pending)

    def pending_block_ids(self) -> list[int]:
        return [b for load, _ in self._pending for b in load.block_ids]

    def start(self, layout: FrameLayout, block_ids: list[int], sources: list) -> None:
        load = LayerLoad(self.layers, layout, block_ids, sources)
        self._pending.append((load, self._executor.submit(load.run)))

    def wait(self, layer: int) -> None:
        """Before attention reads layer ``layer``: every pending load has copied it."""
        for load, _ in self._pending:
            self.wait_s += load.wait(layer)

    def finish(self) -> float:
        """Complete every pending load (re-raising a copy's error); the copy seconds of
        the loads finished."""
        loads, self._pending = self._pending, []
        copy_s = 0.0
        for load, future in loads:
            start_s = time.perf_counter()
            future.result()
            self.wait_s += time.perf_counter() - start_s
            copy_s += load.copy_s
        self.copy_s += copy_s
        return copy_s

    def close(self) -> None:
        """Let every pending load finish, then stop the thread. Idempotent."""
        if self._executor is not None:
            try:
                self.finish()
            finally:
                self._executor.shutdown(wait=True)
                self._executor = None
