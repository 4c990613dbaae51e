"""The one doorway between the engine and the tiers below its pool.

The engine owns one :class:`Offloader` when its KV spec has ``tiers(...)``, and reaches
the tiered store (``store.py``), the pager (``pager.py``), the prefix loads and the cost
model only through it. What comes back is typed (``decisions.py``), never a reference
the engine would reach through:

    scheduler   take_prefix / read_ahead (admission), page_out -> PageOut, drop
    runner      step(decodes, prefills) -> OffloadStep (once a step), finish_loads
    engine      observe_run (the cost model's compute rate), usage / as_dict / close
    policies    keep_evicted (``evict_to``), page_out_all / read_front / drop
                (``prefill=offload``, ``prefill.py``)

A ``PageOut`` changes neither the request nor the pool here: its frames are written,
and the scheduler frees its blocks and shortens the block table
(``Scheduler.apply_page_out``). So the pool's blocks are freed in one place, the
engine's.
"""
from __future__ import annotations

import torch

from kvmap.config import ModelConfig
from kvmap.kv.cache import PagedKVCache
from kvmap.kv.offload.decisions import OffloadStep, PageOut
from kvmap.kv.offload.pager import Pager
from kvmap.kv.offload.store import StoreLevel, TieredStore
from kvmap.kv.tiers.layout import Layout
from kvmap.request import Request


class Offloader:
    """The tiers below one paged KV cache, per ``layout``. ``paging``: sequences larger
    than the pool may be paged out (off with a selection policy, which compresses
    resident blocks only; ``prefill=offload`` pages its prompt through
    :meth:`page_out_all` either way)."""

    def __init__(self, layout: Layout, kv: PagedKVCache, model_config: ModelConfig,
                 model_identity: str | None = None, paging: bool = True) -> None:
        self.store = TieredStore(layout, kv, model_config, model_identity)
        o = layout.options
        try:
            self.pager = Pager(self.store, o.get("prefetch", "none"),
                               o.get("prefetch_depth", 2), o.get("prefetch_pages", 0))
        except BaseException:
            self.store.close()
            raise
        self.paging = paging

    @property
    def levels(self) -> list[StoreLevel]:
        """The store's levels, top-down (read them, e.g. for per-tier counters)."""
        return self.store.levels

    @property
    def page_blocks(self) -> int:
        return self.pager.page_blocks

    # ---- admission (scheduler) ---------------------------------------------------------
    def take_prefix(self, block_hashes: list[bytes], start_block: int,
                    layerwise: bool = False) -> list[int]:
        """``TieredStore.take_prefix``: the blocks after the pool's first
        ``start_block``, each with a reference, from the pool or the tiers."""
        return self.store.take_prefix(block_hashes, start_block, layerwise)

    def read_ahead(self, block_hashes: list[bytes]) -> None:
        self.store.read_ahead(block_hashes)

    # ---- paging (scheduler) ------------------------------------------------------------
    def is_paged(self, request_id: str) -> bool:
        return self.pager.is_paged(request_id)

    def page_out(self, req: Request, num_free_wanted: int) -> PageOut | None:
        """Pages of ``req`` written to the tiers until freeing them leaves
        ``num_free_wanted`` free pool blocks (``Pager.page_out``); None when paging is
        off or nothing went."""
        if not self.paging:
            return None
        self.store.finish_loads()          # paging out reads the blocks just fetched
        return self.pager.page_out(req, num_free_wanted)

    def page_out_all(self, req: Request) -> PageOut | None:
        """Every whole page of ``req``'s full resident blocks (``prefill=offload``)."""
        self.store.finish_loads()
        return self.pager.page_out_all(req)

    def drop(self, request_id: str) -> None:
        """Forget the request's pages (finished, aborted, preempted or compressed)."""
        self.pager.drop(request_id)

    # ---- the step (runner) -------------------------------------------------------------
    def step(self, decodes: list[Request], prefills: list[Request]) -> OffloadStep:
        """What attention needs from the tiers this step: the paged-out front of each
        paged request among the batch's decode rows and prefill segments (in batch
        order), and the layer-wise prefix loads still running."""
        decode = {i: ctx for i, r in enumerate(decodes)
                  if (ctx := self.pager.context(r)) is not None}
        prefill = {i: ctx for i, r in enumerate(prefills)
                   if (ctx := self.pager.context(r)) is not None}
        return OffloadStep(decode, prefill, self.store.loads.pending())

    def finish_loads(self) -> None:
        """After the forward pass (and before anything reads a block's content)."""
        self.store.finish_loads()

    def observe_run(self, spans: list[tuple[int, int]], seconds: float) -> None:
        """One model run computed token ``spans`` [start, end) in ``seconds``: the cost
        model learns the compute rate."""
        self.store.cost.observe_run(spans, seconds)

    # ---- selection policies ------------------------------------------------------------
    def keep_evicted(self, block_id: int, block_hash: bytes, level_name: str) -> bool:
        return self.store.keep_evicted(block_id, block_hash, level_name)

    def num_offloaded_tokens(self, req: Request) -> int:
        """Tokens of ``req`` paged out to the tiers (0 when it is not paged)."""
        ctx = self.pager.context(req)
        return ctx.num_tokens if ctx is not None else 0

    def read_front(self, req: Request, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """K, V of ``req``'s paged-out front in ``layer``, each (H, tokens, D); None
        when it is not paged. Raises ``PageLost``."""
        ctx = self.pager.context(req)
        return ctx.layer_kv(layer) if ctx is not None else None

    # ---- reporting and lifetime --------------------------------------------------------
    def resident_bytes(self) -> dict[str, int]:
        """Per level: the bytes it holds now (cheap: no latency percentiles)."""
        return {name: r["resident_bytes"] for name, r in self.store.resident().items()}

    def usage(self) -> dict:
        return self.store.usage()

    def as_dict(self) -> dict:
        return {**self.store.as_dict(), "paging": self.pager.as_dict()}

    def check_integrity(self) -> None:
        self.store.check_integrity()

    def close(self) -> None:
        """Stop the prefetch thread, then release every level. Idempotent."""
        self.pager.close()
        self.store.close()
