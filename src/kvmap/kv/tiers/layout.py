"""The tier-layout parts of a KV spec: ``tiers(...)`` and ``recompute``.

    tiers(host=SIZE, disk=SIZE, disk_path=DIR, redis=URL|env:NAME, redis_size=SIZE,
          evict=lru|lfu|arc, fetch=cost|always,
          prefetch=none|window|attention, page_blocks=N, prefetch_depth=N,
          prefetch_pages=N, host_codec=CODEC, disk_codec=CODEC, redis_codec=CODEC)
    recompute

The per-level options come from the registered tier backends (``backend.py``): each
backend ``NAME`` adds ``NAME=``, ``NAME_codec=`` and its own options, so a new backend
needs no edit here. A layout only describes; :class:`kvmap.kv.offload.store.TieredStore`
builds the tiers.

Levels run top-down (host -> disk -> redis, by each backend's ``order``), over the ones
given (at least one). A block
that leaves the pool goes to the top level; a level's victims go to the next one down.
A level's codec defaults to the one above it (the pool's codec for the top level), so
``tiers(host=1GiB, disk=8GiB, disk_codec=int4)`` keeps host blocks exact and re-encodes
them to int4 as they move to disk; the accuracy cost is then measured like any codec.

``fetch=cost`` lets the cost model (``cost.py``) choose per request between fetching a
cached prefix from the tiers and recomputing it; ``fetch=always`` skips the model (tests,
and measuring the tiers' own cost).

A sequence that does not fit the pool even alone is paged through the levels
(``pager.py``): its oldest blocks leave in pages of ``page_blocks`` blocks (default 16),
one frame per page per layer. ``prefetch`` says how attention gets them back: ``none``
reads a layer's pages when it needs them; ``window`` reads ``prefetch_depth`` layers
ahead (default 2) on a background thread, in page order; ``attention`` does the same
ordered by the attention mass each page got in the last step. ``prefetch_pages=K``
(default 0: all) reads only the first K pages of that order ahead, the rest on demand.

``recompute`` is the explicit no-tier layout: blocks that leave the pool are gone and
preempted or missing prefixes are recomputed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvmap.kv import grammar
from kvmap.kv.codecs import CODECS, Codec
from kvmap.kv.options import Options
from kvmap.kv.tiers.backend import backends_top_down
from kvmap.kv.tiers.eviction import EVICTION_ORDERS
from kvmap.kv.tiers.prefetch import PREFETCH_ORDERS
from kvmap.registry import Registry

FETCH_MODES = ("cost", "always")
# spec-string name -> layout part (``tiers``, ``recompute``)
TIER_PARTS: Registry[type] = Registry("tier layout")


@dataclass(frozen=True)
class TierLevel:
    """One level of a layout: which tier, how many bytes, which codec (None: the codec
    of the level above, or the pool's) and the backend's own options."""

    name: str
    capacity_bytes: int
    codec: Codec | None = None
    backend_options: dict = field(default_factory=dict)


class Layout(Options):
    """Base of the tier-layout parts. ``levels`` is empty for no tiers."""

    kind: ClassVar[str] = "tiers"
    levels: tuple[TierLevel, ...] = ()
    fetch: str = "cost"


@TIER_PARTS.register
class Recompute(Layout):
    """No tiers: blocks that leave the pool are dropped; prefixes are recomputed."""

    name = "recompute"


@TIER_PARTS.register
class Tiers(Layout):
    """Host RAM, local disk and Redis below the pool (see the module docstring)."""

    name = "tiers"
    common_defaults: ClassVar[dict] = {
        "evict": "lru", "prefetch": "none", "fetch": "cost", "page_blocks": 16,
        "prefetch_depth": 2, "prefetch_pages": 0}

    @property
    def defaults(self) -> dict:
        """The common options and every registered backend's (all default None)."""
        per_backend = {option: None for backend in backends_top_down()
                       for option in backend.spec_options()}
        return {**per_backend, **self.common_defaults}

    def validate(self) -> None:
        o = self.options
        if o["evict"] not in EVICTION_ORDERS:
            raise ValueError(f"tiers: evict={o['evict']!r} is not one of "
                             f"{', '.join(EVICTION_ORDERS)}")
        if o["prefetch"] is None:          # the grammar reads `none` as None
            o["prefetch"] = "none"
        if o["prefetch"] not in PREFETCH_ORDERS:
            raise ValueError(f"tiers: prefetch={o['prefetch']!r} is not one of "
                             f"{', '.join(PREFETCH_ORDERS)}")
        for option, low in (("page_blocks", 1), ("prefetch_depth", 1), ("prefetch_pages", 0)):
            value = o[option]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"tiers: {option}={value!r} must be an integer >= {low}")
        if o["fetch"] not in FETCH_MODES:
            raise ValueError(f"tiers: fetch={o['fetch']!r} is not one of "
                             f"{', '.join(FETCH_MODES)}")
        self.fetch = o["fetch"]
        levels = []
        for backend in backends_top_down():
            codec = _codec(o[f"{backend.name}_codec"], f"{backend.name}_codec")
            if not backend.enabled(o):
                backend.check_unused(o)
                continue
            capacity, backend_options = backend.level_args(o)
            levels.append(TierLevel(backend.name, capacity, codec, backend_options))
        if not levels:
            given = ", ".join(f"{b.name}=" for b in backends_top_down())
            raise ValueError(f"tiers: give at least one of {given} (or use "
                             "`recompute` for no tiers)")
        self.levels = tuple(levels)


def _codec(value: Any, option: str) -> Codec | None:
    """``int4`` or ``int4(granularity=token)`` -> a validated codec; None stays None."""
    if value is None:
        return None
    name, args = ((value.name, value.args) if isinstance(value, grammar.Part)
                  else (str(value), {}))
    if name not in CODECS:
        raise ValueError(f"tiers: {option}={value} is not a codec; one of "
                         f"{', '.join(sorted(CODECS))}")
    try:
        return CODECS[name](**args)
    except ValueError as e:
        raise ValueError(f"tiers: {option}={value}: {e}") from None
