"""Offloading: where the pool and the tiers meet (``docs/architecture.md``)."""
