"""Prefetch orders: which pages of a paged-out sequence's layer are read ahead, first
first (``tiers(prefetch=...)``; the pager, ``kvmap.kv.offload.pager``, reads them).

Each order registers itself in ``PREFETCH_ORDERS`` and overrides one method,
``order(num_pages, mass)``: ``mass`` is the attention mass (one value per page seen,
oldest page first) the layer's pages received in the last step, or None. Every order is
exact: every page is attended, only what is read early differs.
"""
from __future__ import annotations

from collections.abc import Sequence

from kvmap.registry import Registry


class PrefetchOrder:
    name = ""
    reads_ahead = True             # False: every page is read when attention needs it

    def order(self, num_pages: int, mass: Sequence[float] | None) -> list[int]:
        raise NotImplementedError


# name -> PrefetchOrder subclass
PREFETCH_ORDERS: Registry[type[PrefetchOrder]] = Registry("prefetch order")


@PREFETCH_ORDERS.register
class NoPrefetch(PrefetchOrder):
    """Nothing is read ahead: a layer's pages are read when that layer needs them."""

    name = "none"
    reads_ahead = False

    def order(self, num_pages: int, mass: Sequence[float] | None) -> list[int]:
        return []


@PREFETCH_ORDERS.register
class Window(PrefetchOrder):
    """The next layers' pages, in page order (oldest first)."""

    name = "window"

    def order(self, num_pages: int, mass: Sequence[float] | None) -> list[int]:
        return list(range(num_pages))


@PREFETCH_ORDERS.register
class Attention(PrefetchOrder):
    """Pages never seen first (the newest), then the others by the attention mass they
    received in the last step, heaviest first."""

    name = "attention"

    def order(self, num_pages: int, mass: Sequence[float] | None) -> list[int]:
        seen = 0 if mass is None else min(len(mass), num_pages)
        ranked = sorted(range(seen), key=lambda p: -float(mass[p])) if seen else []
        return list(range(seen, num_pages)) + ranked
