"""Paging a context larger than the pool through the tiers, with prefetching.

A running sequence that cannot grow even alone in the pool is *paged*: its oldest full
blocks leave the pool in pages of ``page_blocks`` blocks, written one frame per page per
layer (``page_frames.py``) to the top tier level; the pager returns what went (a
``PageOut``, ``decisions.py``) and the engine's scheduler frees those pool blocks and
shortens the request's block table. The sequence keeps, resident, everything after its
paged-out front::

    logical tokens   [ page 0 | page 1 | ... | page n-1 | resident blocks ... | new ]
                       ^ in the tiers, per layer            ^ req.block_ids, num_kv_slots

``req.block_ids`` and ``req.num_kv_slots`` then describe the resident part only (as
after a selection policy's eviction), while positions still count every token. Every
offloaded key precedes every query, so attention needs no mask for it: per layer the
model attends over the resident blocks (the usual paged path) and over the pages fetched
back, and merges the two partial results exactly by log-sum-exp
(``kvmap.model.attention``). Nothing is dropped: the result is dense attention over the
whole context, up to floating-point rounding.

Prefetch (``tiers(prefetch=...)``; the orders are ``kvmap.kv.tiers.prefetch``'s):

- ``none``: a layer's pages are read when that layer needs them; the model waits for
  every read.
- ``window``: one background thread reads ahead: when layer l asks for its pages, the
  pages of layers l+1 .. l+depth (wrapping into the next step's first layers) are
  queued, in page order. The model waits only for what is not ready yet.
- ``attention``: like ``window``, but each layer's pages are queued by the attention
  mass they received in the last step (pages never seen first).

With ``prefetch_pages=K`` only the first K pages of that order are read ahead per layer
(window: the oldest K; attention: the K heaviest); the rest are read when needed. Every
mode is exact: every page is attended, only what is read early differs. (Attending only
the heavy pages, an approximation in the style of Quest or InfLLM, is not built.)

Faults: a page frame missing at every level or failing its checks raises
:class:`PageLost` from the forward pass; the engine then recomputes the sequence
(preemption by recomputation), so a lost page costs time, never a wrong token.

Threads: the tiers are not thread-safe, so every tier call, from either thread, holds
``store.lock``. Counters are updated on the engine thread only (the worker returns what
it measured).
"""
from __future__ import annotations

import itertools
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field

import torch

from kvmap.hardware.omp_team import serial_executor
from kvmap.kv.tiers import serde
from kvmap.kv.tiers.prefetch import PREFETCH_ORDERS
from kvmap.kv.offload.decisions import PageOut
from kvmap.kv.offload.page_frames import page_key



class PageLost(RuntimeError):
    """A page of ``request_id`` could not be read back (missing or corrupt)."""

    def __init__(self, request_id: str, detail: str) -> None:
        super().__init__(f"request {request_id!r}: page lost ({detail}); it is recomputed")
        self.request_id = request_id


@dataclass
class PagingStats:
    """What paging did. Frames are one layer of one page; per-tier bytes, hits and
    read latencies are in each tier's ``TierStats``."""

    num_paged_requests: int = 0       # requests that paged out at least one page
    num_pages_out: int = 0            # pages written (num_layers frames each)
    num_frames_written: int = 0
    bytes_written: int = 0
    num_frames_read: int = 0          # frames attention used
    bytes_read: int = 0
    num_prefetch_hits: int = 0        # ... that the prefetcher had read or was reading
    num_sync_reads: int = 0           # ... read when needed
    num_wasted_prefetches: int = 0    # frames read ahead and never used
    num_cancelled_prefetches: int = 0  # reads queued ahead, cancelled before they ran
    io_wait_s: float = 0.0            # engine thread waiting for frames (model idle)
    read_s: float = 0.0               # time reading frames, either thread
    page_out_s: float = 0.0           # engine time writing pages out
    num_page_faults: int = 0          # pages lost -> the sequence is recomputed
    errors: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["errors"] = dict(self.errors)
        used = self.num_prefetch_hits + self.num_sync_reads
        out["prefetch_hit_rate"] = self.num_prefetch_hits / used if used else 0.0
        return out


@dataclass
class PagedSeq:
    """A paged sequence: its first ``num_pages`` pages live in the tiers."""

    uid: int
    request_id: str
    num_pages: int = 0
    mass: dict = field(default_factory=dict)   # layer -> (num_pages,) fp32, last step


@dataclass
class _Read:
    """What a frame read returned (made on any thread, counted on the engine thread)."""

    k: torch.Tensor | None
    v: torch.Tensor | None
    num_bytes: int
    seconds: float
    error: str | None = None


class OffloadedContext:
    """The paged-out part of one sequence in one forward pass, as attention sees it."""

    def __init__(self, pager: "Pager", seq: PagedSeq) -> None:
        self.pager = pager
        self.seq = seq
        self.page_tokens = pager.frames.page_tokens
        self._last: tuple[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def num_tokens(self) -> int:
        return self.seq.num_pages * self.page_tokens

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of every paged-out token of ``layer``, each (H, num_tokens, D). The last
        layer asked is kept, so that a second reader in the same layer (a policy's
        observation window, then attention) reads the frames once."""
        if self._last is None or self._last[0] != layer:
            self._last = None                      # free the previous layer's first
            self._last = (layer, self.pager.layer_kv(self.seq, layer))
        return self._last[1]

    def observe(self, layer: int, mass: torch.Tensor) -> None:
        """Attention mass (num_pages,) the pages of ``layer`` received in this step."""
        self.seq.mass[layer] = mass


class Pager:
    """Pages sequences of one tiered store (``store.py``) out and back, layer by layer."""

    def __init__(self, store, mode: str = "none", depth: int = 2,
                 prefetch_pages: int = 0) -> None:
        self.order = PREFETCH_ORDERS[mode]()       # ValueError naming the valid modes
        self.store = store
        self.kv = store.kv
        self.mode = mode
        self.depth = depth
        self.prefetch_pages = prefetch_pages
        self.num_layers = self.kv.geom.num_layers
        self.frames = store.page_frames
        self.page_blocks = self.frames.page_blocks
        self.stats = PagingStats()
        self.seqs: dict[str, PagedSeq] = {}
        self._uids = itertools.count()
        self._inflight: dict[tuple[int, int, int], Future] = {}
        self._executor = (serial_executor("kvmap-prefetch")
                          if self.order.reads_ahead else None)

    # ---- residency ---------------------------------------------------------------------
    def is_paged(self, request_id: str) -> bool:
        return request_id in self.seqs

    def context(self, req) -> OffloadedContext | None:
        seq = self.seqs.get(req.request_id)
        return OffloadedContext(self, seq) if seq is not None and seq.num_pages else None

    def page_out(self, req, num_free_wanted: int) -> PageOut | None:
        """Write ``req``'s oldest full resident blocks to the top level, a page at a time,
        until freeing them leaves the pool ``num_free_wanted`` free blocks or nothing more
        can go. The block being written (and any partial one) stays. Returns the pages
        that went, for the caller to free (:class:`PageOut`); None if none did. Reads
        ``req`` and the pool, changes neither."""
        pool, bs, P = self.kv.pool, self.kv.block_size, self.page_blocks
        num_free, num_pages = pool.num_free, 0
        while num_free < num_free_wanted and req.num_kv_slots // bs - num_pages * P >= P:
            page = req.block_ids[num_pages * P:(num_pages + 1) * P]
            if not self._write_page(req.request_id, page):
                break
            num_free += sum(pool.ref_counts[b] == 1 for b in page)   # ours alone: freed
            num_pages += 1
        return self._went(req, num_pages)

    def page_out_all(self, req) -> PageOut | None:
        """Write every whole page of ``req``'s full resident blocks, whatever the pool
        holds (prefill through the tiers, ``kvmap.kv.offload.prefill``): once the caller
        frees them, fewer than ``page_blocks`` full blocks, and any partial one, stay.
        Returns the pages that went (a tier that refuses a frame stops it early)."""
        P = self.page_blocks
        num_full, num_pages = req.num_kv_slots // self.kv.block_size, 0
        while num_full - num_pages * P >= P and self._write_page(
                req.request_id, req.block_ids[num_pages * P:(num_pages + 1) * P]):
            num_pages += 1
        return self._went(req, num_pages)

    def _went(self, req, num_pages: int) -> PageOut | None:
        if num_pages == 0:
            return None
        num_blocks = num_pages * self.page_blocks
        return PageOut(req.request_id, tuple(req.block_ids[:num_blocks]),
                       num_pages * self.frames.page_tokens)

    def _write_page(self, request_id: str, blocks: list[int]) -> bool:
        """One page's frames, every layer, into the top level; False (counted, nothing
        left behind) when the level refuses one."""
        start_s = time.perf_counter()
        seq = self.seqs.get(request_id)
        if seq is None:
            seq = PagedSeq(next(self._uids), request_id)
        page = seq.num_pages
        top = self.store.levels[0]
        written: list[str] = []
        with self.store.lock:
            for layer in range(self.num_layers):
                key = page_key(seq.uid, page, layer)
                data = self.frames.encode(blocks, layer, top.codec)
                if not top.tier.put(key, data):
                    self.stats.errors["page_out_failed"] += 1
                    for done in written:
                        top.tier.delete(done)
                    self.stats.page_out_s += time.perf_counter() - start_s
                    return False
                written.append(key)
                self.stats.num_frames_written += 1
                self.stats.bytes_written += len(data)
        if request_id not in self.seqs:
            self.seqs[request_id] = seq
            self.stats.num_paged_requests += 1
        seq.num_pages += 1
        self.stats.num_pages_out += 1
        self.stats.page_out_s += time.perf_counter() - start_s
        return True

    def drop(self, request_id: str) -> None:
        """Forget the pages of ``request_id`` (finished, aborted or preempted): cancel
        its reads ahead and delete its frames from every level."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return
        for key in [k for k in self._inflight if k[0] == seq.uid]:
            self._discard(self._inflight.pop(key))
        with self.store.lock:
            for page in range(seq.num_pages):
                for layer in range(self.num_layers):
                    key = page_key(seq.uid, page, layer)
                    for level in self.store.levels:
                        level.tier.delete(key)

    # ---- reading back --------------------------------------------------------------------
    def layer_kv(self, seq: PagedSeq, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of ``seq``'s pages for ``layer``, in page order, each (H, tokens, D).
        Queues the next layers' reads first (``window``/``attention``). Raises PageLost."""
        if self._executor is not None:
            self._prefetch_ahead(seq, layer)
        ks, vs = [], []
        start_s = time.perf_counter()
        lost = None
        for page in range(seq.num_pages):
            future = self._inflight.pop((seq.uid, page, layer), None)
            if future is None:
                read = self._read(seq.uid, page, layer)
                self.stats.num_sync_reads += 1
            else:
                read = future.result()
                self.stats.num_prefetch_hits += 1
            self.stats.read_s += read.seconds
            if read.error is not None:
                self.stats.errors[read.error] += 1
                lost = lost or f"page {page} layer {layer}: {read.error}"
                continue
            self.stats.num_frames_read += 1
            self.stats.bytes_read += read.num_bytes
            ks.append(read.k)
            vs.append(read.v)
        self.stats.io_wait_s += time.perf_counter() - start_s
        if lost is not None:
            self.stats.num_page_faults += 1
            raise PageLost(seq.request_id, lost)
        # (tokens, H, D) pages -> one contiguous (H, tokens, D), the layout bmm wants
        return (torch.cat([k.transpose(0, 1) for k in ks], dim=1),
                torch.cat([v.transpose(0, 1) for v in vs], dim=1))

    def _prefetch_ahead(self, seq: PagedSeq, layer: int) -> None:
        for d in range(1, min(self.depth, self.num_layers - 1) + 1):  # never this layer
            nxt = (layer + d) % self.num_layers
            for page in self._order(seq, nxt):
                key = (seq.uid, page, nxt)
                if key not in self._inflight:
                    self._inflight[key] = self._executor.submit(self._read, *key)

    def _order(self, seq: PagedSeq, layer: int) -> list[int]:
        """The pages of ``layer`` to read ahead, first first (``self.order``)."""
        pages = self.order.order(seq.num_pages, seq.mass.get(layer))
        return pages[:self.prefetch_pages] if self.prefetch_pages else pages

    def _read(self, uid: int, page: int, layer: int) -> _Read:
        """Read and check one frame from the highest level holding it (any thread)."""
        key = page_key(uid, page, layer)
        start_s = time.perf_counter()
        with self.store.lock:
            for level in self.store.levels:
                data = level.tier.get(key)
                if data is not None:
                    break
            else:
                return _Read(None, None, 0, time.perf_counter() - start_s, "page_missing")
        try:
            k, v = self.frames.decode_kv(data, layer, level.codec,
                                         check_crc=not level.tier.verify_reads)
        except serde.DECODE_ERRORS as e:   # CorruptBlockError, FrameMismatch, ...
            with self.store.lock:
                level.tier.delete(key)
            kind = "page_corrupt" if isinstance(e, serde.CorruptBlockError) else "page_mismatch"
            return _Read(None, None, 0, time.perf_counter() - start_s, kind)
        return _Read(k, v, len(data), time.perf_counter() - start_s)

    # ---- lifetime ------------------------------------------------------------------------
    def _discard(self, future: Future) -> None:
        if future.cancel():
            self.stats.num_cancelled_prefetches += 1
        else:                            # already reading: let it finish, so that the
            future.result()              # tiers' counters are final when we return
            self.stats.num_wasted_prefetches += 1

    def as_dict(self) -> dict:
        return {"prefetch": self.mode, "page_blocks": self.page_blocks,
                "prefetch_depth": self.depth, "prefetch_pages": self.prefetch_pages,
                "frame_bytes": {lv.tier.name: self.frames.frame_bytes(lv.codec)
                                for lv in self.store.levels},
                **self.stats.as_dict()}

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self._inflight.clear()
        self.seqs.clear()
