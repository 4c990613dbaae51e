"""Redis tier: blocks as string values in a real redis-server, through redis-py.

Every key is stored as ``key_prefix + base.key_bytes(key)``. The tier keeps its own
size accounting of what it stored (Redis's memory use includes its own overhead and
other clients); if the server loses a key (restart, its own maxmemory eviction) the
next get is a miss counted as ``lost``.

Faults never reach the caller. Per redis-py exception:

    ConnectionError (refused, reset)  -> "connection"  } the server is marked down
    TimeoutError (socket_timeout_s)    -> "timeout"     } for a backoff interval
    OutOfMemoryError ("OOM ... maxmemory") -> "oom"     (a failed put; server is up)
    any other RedisError               -> "redis"

While marked down, gets are misses and puts fail at once, counted as ``throttled``,
without touching the network. The backoff starts at ``backoff_initial_s`` and doubles
per consecutive failure up to ``backoff_max_s``; the first success resets it.
redis-py's own retries are switched off so that one call costs at most one timeout.
"""
from __future__ import annotations

import time
import uuid
from typing import Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvmap.kv.tiers.base import Key, Tier, TierError, key_bytes

_DOWN_ERRORS = {redis.exceptions.ConnectionError: "connection",
                redis.exceptions.TimeoutError: "timeout"}


class RedisTier(Tier):
    """Blocks in the Redis at ``url`` under ``key_prefix`` (default: unique per tier,
    so tiers sharing a server never collide). Connects lazily, on first use."""

    name = "redis"
    verify_reads = True
    authenticate = True

    def __init__(self, capacity_bytes: int, eviction="lru", on_evict=None, *,
                 url: str = "redis://127.0.0.1:6390/0",
                 key_prefix: str | None = None, socket_timeout_s: float = 0.2,
                 backoff_initial_s: float = 0.05, backoff_max_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(capacity_bytes, eviction, on_evict)
        for label, value in (("socket_timeout_s", socket_timeout_s),
                             ("backoff_initial_s", backoff_initial_s)):
            if value <= 0:
                raise ValueError(f"{label}={value!r} must be positive")
        if backoff_max_s < backoff_initial_s:
            raise ValueError(f"backoff_max_s={backoff_max_s!r} is below "
                             f"backoff_initial_s={backoff_initial_s!r}")
        self.key_prefix = (key_prefix if key_prefix is not None
                           else f"kvmap:{uuid.uuid4().hex[:12]}:").encode()
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                           socket_connect_timeout=socket_timeout_s,
                                           retry=Retry(NoBackoff(), 0),
                                           health_check_interval=0)
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self._clock = clock
        self._backoff_s = 0.0      # current backoff; 0 while the server answers
        self._down_until_s = 0.0   # clock time before which the server is not tried

    def _rkey(self, key: Key) -> bytes:
        return self.key_prefix + key_bytes(key)

    def _unavailable(self) -> str | None:
        return "throttled" if self._clock() < self._down_until_s else None

    def _call(self, fn, *args):
        """Run one redis command; map its failure to TierError, track up/down."""
        try:
            result = fn(*args)
        except redis.exceptions.RedisError as e:
            kind = next((k for cls, k in _DOWN_ERRORS.items() if isinstance(e, cls)), None)
            if kind is not None:
                self._backoff_s = min(self.backoff_max_s,
                                      2 * self._backoff_s or self.backoff_initial_s)
                self._down_until_s = self._clock() + self._backoff_s
            elif isinstance(e, redis.exceptions.OutOfMemoryError):
                kind = "oom"
            raise TierError(kind or "redis", str(e)) from e
        self._backoff_s = 0.0
        return result

    def _read(self, key: Key) -> bytes | None:
        return self._call(self.client.get, self._rkey(key))

    def _write(self, key: Key, data: bytes) -> None:
        self._call(self.client.set, self._rkey(key), data)

    def _delete(self, key: Key) -> None:
        if self._unavailable() is None:  # a throttled delete is skipped, not counted
            self._call(self.client.unlink, self._rkey(key))

    def close(self) -> None:
        """Best-effort delete of every stored block, then drop the connections."""
        keys = [self._rkey(k) for k in self.keys()]
        for start in range(0, len(keys), 512):
            try:
                self.client.unlink(*keys[start:start + 512])
            except redis.exceptions.RedisError:
                break
        for key in self.keys():
            self._forget(key)
        self.client.close()
