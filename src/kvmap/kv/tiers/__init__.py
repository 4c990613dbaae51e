"""The tiers below the pool. Importing this package registers the layout parts
(``tiers(...)``, ``recompute``: ``TIER_PARTS`` in ``layout.py``) and every tier backend
(``TIER_BACKENDS`` in ``backend.py``; each backend file registers itself)."""
from __future__ import annotations

from kvmap.kv.tiers import disk, host, redis_backend  # noqa: F401  (they register)
from kvmap.kv.tiers.backend import TIER_BACKENDS
from kvmap.kv.tiers.layout import TIER_PARTS

__all__ = ["TIER_BACKENDS", "TIER_PARTS"]
