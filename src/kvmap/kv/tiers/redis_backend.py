"""The ``redis`` tier backend: ``tiers(redis=URL[, redis_size=1GiB, shared=true,
shared_key=env:NAME])``. A level is this process's own
:class:`~kvmap.kv.tiers.redis_tier.RedisTier`, or, with ``shared=true``, a
:class:`~kvmap.kv.tiers.shared_redis.SharedRedisTier` that processes of the same model
and KV layout read each other's prefix blocks from."""
from __future__ import annotations

from kvmap.kv.tiers.backend import TIER_BACKENDS, TierBackend
from kvmap.kv.tiers.redis_tier import RedisTier, check_url, sweep_dead_namespaces
from kvmap.kv.tiers.redis_url import connection_options
from kvmap.kv.tiers.shared_namespace import check_shared_options
from kvmap.kv.tiers.shared_redis import SharedRedisTier


def make_redis_tier(capacity_bytes: int, eviction="lru", on_evict=None, *,
                    shared: bool = False, **kwargs) -> RedisTier:
    """The redis level a layout asks for: shared, or this process's own."""
    cls = SharedRedisTier if shared else RedisTier
    return cls(capacity_bytes, eviction, on_evict, **kwargs)


def sweep_after_kill(options: dict) -> None:
    """A killed process's redis level: delete the private namespaces of dead processes
    of this host in its server (shared namespaces expire by their TTL)."""
    import redis
    parsed, credentials = connection_options(options["url"])
    client = redis.Redis.from_url(parsed.bare, socket_timeout=1.0,
                                  socket_connect_timeout=1.0, **credentials)
    try:
        sweep_dead_namespaces(client)
    finally:
        client.close()


TIER_BACKENDS.register("redis")(TierBackend(
    "redis", make_redis_tier, order=30, latency_prior_s=500e-6,
    bandwidth_prior_bytes_per_s=2e8, options={"shared": "shared", "shared_key": "shared_key"},
    locator="url", size_option="redis_size", default_size="1GiB", check=check_url,
    check_options=check_shared_options, sweep=sweep_after_kill))
