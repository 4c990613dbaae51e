"""Tier backends by name: what ``tiers(...)`` accepts for each, how its level is built, and
the cost model's priors for it.

A backend registers its :class:`~kvmap.kv.tiers.base.Tier` class where it is defined::

    @tier_backend(order=20, latency_prior_s=200e-6, bandwidth_prior_bytes_per_s=5e8,
                  options={"disk_path": "parent"})
    class DiskTier(Tier):
        name = "disk"

and from then on ``tiers(disk=4GiB, disk_path=/tmp/x, disk_codec=int4)`` parses
(``layout.py``), the tiered store builds the level (``kvmap.kv.offload.store``), the
cost model prices it (``kvmap.kv.offload.cost``), the bench sweeps a killed cell's
storage through ``sweep`` and ``kvmap specs`` lists it -- none of them names a backend. The
spec options of a backend called ``NAME``:

- ``NAME=`` enables the level; its value is the capacity (``host=1GiB``), or, with
  ``locator`` set, a location handed to the constructor (``redis=redis://...``, whose
  capacity is then ``size_option``, ``redis_size=``, default ``default_size``);
- ``NAME_codec=`` the level's codec (default: the codec of the level above);
- each key of ``options``: passed to the constructor under the mapped keyword.

Levels run top-down by ``order`` (host 10, disk 20, redis 30).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvmap.config import parse_size
from kvmap.registry import Registry


@dataclass(frozen=True)
class TierBackend:
    name: str
    tier_class: Callable             # a Tier subclass, or a factory of Tiers, called as
                                     # (capacity_bytes, eviction, **kwargs)
    order: int                       # position of its level, top (small) to bottom
    latency_prior_s: float           # cost model priors until fetches are measured
    bandwidth_prior_bytes_per_s: float
    options: Mapping[str, str] = field(default_factory=dict)  # spec option -> keyword
    locator: str | None = None       # keyword that NAME= goes to when it is not a size
    size_option: str | None = None   # spec option of the capacity with a locator
    default_size: str | None = None
    check: Callable[[Any], None] | None = None   # validates NAME= (ValueError)
    check_options: Callable[[dict], None] | None = None  # validates options together
    # after a process of this layout was killed (it ran no clean-up): removes the storage
    # of dead processes that a level's constructor keywords point at; best effort
    sweep: Callable[[dict], None] | None = None

    def __post_init__(self) -> None:
        if (self.locator is None) != (self.size_option is None):
            raise ValueError(f"tier backend {self.name!r}: locator and size_option go "
                             "together (NAME= is a size unless it is a location)")

    def spec_options(self) -> tuple[str, ...]:
        """Every ``tiers(...)`` option this backend adds."""
        extra = (self.size_option,) if self.size_option else ()
        return (self.name, *extra, *self.options, f"{self.name}_codec")

    def enabled(self, options: dict) -> bool:
        return options.get(self.name) is not None

    def check_unused(self, options: dict) -> None:
        """A disabled backend: none of its other options may be given."""
        for option in self.spec_options()[1:]:
            if options.get(option) is not None:
                value = options[option]
                shown = str(value).lower() if isinstance(value, bool) else value
                raise ValueError(f"tiers: {option}={shown} is given without {self.name}=")

    def level_args(self, options: dict) -> tuple[int, dict]:
        """(capacity_bytes, constructor keywords) of an enabled backend from the layout's
        options; ValueError naming the bad option."""
        value = options[self.name]
        if self.check is not None:
            self.check(value)
        if self.check_options is not None:
            self.check_options(options)
        kwargs = {kw: options[opt] for opt, kw in self.options.items()
                  if options.get(opt) is not None}
        if self.locator is None:
            size, size_option = value, self.name
        else:
            kwargs[self.locator] = value
            size, size_option = options.get(self.size_option) or self.default_size, \
                self.size_option
        capacity = parse_size(size, f"tiers {size_option}")
        if capacity <= 0:
            raise ValueError(f"tiers: {size_option}={size} must be a positive byte size")
        return capacity, kwargs

    def create(self, capacity_bytes: int, eviction: str, **kwargs: Any):
        return self.tier_class(capacity_bytes, eviction, **kwargs)

    def sweep_after_kill(self, kwargs: dict) -> None:
        """``sweep`` with a level's constructor keywords, if the backend has one."""
        if self.sweep is not None:
            self.sweep(kwargs)


TIER_BACKENDS: Registry[TierBackend] = Registry("tier backend")


def tier_backend(*, replace: bool = False, **fields: Any) -> Callable[[type], type]:
    """Class decorator: register the Tier subclass under its ``name`` with ``fields``
    (those of :class:`TierBackend`). Returns the class unchanged."""
    def decorate(cls: type) -> type:
        TIER_BACKENDS.register(cls.name, replace=replace)(TierBackend(cls.name, cls, **fields))
        return cls
    return decorate


def backends_top_down() -> list[TierBackend]:
    return sorted((TIER_BACKENDS[name] for name in TIER_BACKENDS), key=lambda b: b.order)
