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

Credentials come only from the environment: ``url="env:NAME"`` reads the URL from
variable NAME (``tiers(redis=env:KVMAP_REDIS_URL)``), and ``KVMAP_REDIS_PASSWORD``, when
set, is the password of a URL that has none (a user name in the URL is kept). A URL in a
spec with a password in it is refused when the spec is parsed (``check_url``), saying
how to pass it. The URL is parsed once, by structure, and never quoted in an error
(``redis_url.py``); ``self.url`` is the URL without its user info.

Leaks: a tier's private namespace is ``kvmap:<owner>:<pid>:<random>:`` (``owner``: the
host name and a hash of its boot id and pid namespace, ``owner.owner_tag``); every key
gets a TTL (``key_ttl_s``, refreshed by each put), :meth:`close` and an ``atexit`` hook
delete the namespace, and the first tier of a process deletes the namespaces of dead
processes with its own owner tag (a killed cell runs neither) -- never those of another
pid namespace that shares the host name, whose pids it cannot see. A ``key_prefix`` given explicitly is a shared
namespace: it is never swept by another process, only expired by its TTL.

The ``redis`` backend is registered in ``redis_backend.py``, which builds this tier or
its shared variant (``shared_redis.py``, ``tiers(redis=URL, shared=true, ...)``).
"""
from __future__ import annotations

import atexit
import os
import time
import uuid
import weakref
from typing import Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvmap.kv.redact import check_no_password, redact_url
from kvmap.kv.tiers.base import Key, Tier, TierError, key_bytes
from kvmap.kv.tiers.owner import owner_tag, pid_alive
from kvmap.kv.tiers.redis_url import (PASSWORD_ENV, connection_options,
                                      remember_env_secrets, resolve_url)

__all__ = ["RedisTier", "check_url", "resolve_url", "private_prefix",
           "sweep_dead_namespaces", "PASSWORD_ENV"]

_DOWN_ERRORS = {redis.exceptions.ConnectionError: "connection",
                redis.exceptions.TimeoutError: "timeout"}
DEFAULT_KEY_TTL_S = 7200       # outlives the default cell timeout (1800 s) with room
_SWEEP_MAX_KEYS = 200_000      # bound on what one start-up sweep scans
_swept_urls: set[str] = set()  # servers this process has swept already


def private_prefix() -> str:
    """A namespace of this process's own: ``kvmap:<owner>:<pid>:<random>:``."""
    return f"kvmap:{owner_tag()}:{os.getpid()}:{uuid.uuid4().hex[:12]}:"


def sweep_dead_namespaces(client) -> int:
    """Delete the private namespaces of dead processes with this process's owner tag
    (same host, boot and pid namespace); the number of keys deleted. Namespaces of other
    hosts or pid namespaces, and shared ones, are left to their TTLs."""
    host = owner_tag()
    dead: set[bytes] = set()
    deleted = 0
    for n, rkey in enumerate(client.scan_iter(match=f"kvmap:{host}:*", count=1000)):
        if n >= _SWEEP_MAX_KEYS:
            break
        parts = rkey.split(b":", 4)
        if len(parts) < 5 or not parts[2].isdigit():
            continue
        pid = int(parts[2])
        if pid != os.getpid() and (b":".join(parts[:4]) in dead or not pid_alive(pid)):
            dead.add(b":".join(parts[:4]))
            deleted += client.unlink(rkey)
    return deleted


def check_url(url) -> None:
    """``tiers(redis=URL)``: the URL schemes redis-py connects to, and no password in
    it (ValueError saying how to pass one)."""
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://",
                                                       "env:")):
        raise ValueError(f"tiers: redis={redact_url(str(url))!r} is not a redis://, "
                         "rediss:// or unix:// URL, nor env:NAME (the URL in variable NAME)")
    check_no_password(url, "tiers: redis=", f"Give it in ${PASSWORD_ENV}, or the whole "
                      "URL in an environment variable: redis=env:NAME.")
    remember_env_secrets(url)


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
                 key_ttl_s: int = DEFAULT_KEY_TTL_S, auth_key: bytes | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(capacity_bytes, eviction, on_evict, auth_key=auth_key)
        for label, value in (("socket_timeout_s", socket_timeout_s),
                             ("backoff_initial_s", backoff_initial_s)):
            if value <= 0:
                raise ValueError(f"{label}={value!r} must be positive")
        if backoff_max_s < backoff_initial_s:
            raise ValueError(f"backoff_max_s={backoff_max_s!r} is below "
                             f"backoff_initial_s={backoff_initial_s!r}")
        if isinstance(key_ttl_s, bool) or not isinstance(key_ttl_s, int) or key_ttl_s <= 0:
            raise ValueError(f"key_ttl_s={key_ttl_s!r} must be a positive int of seconds")
        self.private = key_prefix is None
        self.key_prefix = (key_prefix if key_prefix is not None
                           else private_prefix()).encode()
        parsed, credentials = connection_options(url)    # parsed once (redis_url.py)
        self.url = parsed.bare                    # for display; never the password
        self.key_ttl_s = key_ttl_s
        self.client = redis.Redis.from_url(parsed.bare, socket_timeout=socket_timeout_s,
                                           socket_connect_timeout=socket_timeout_s,
                                           retry=Retry(NoBackoff(), 0),
                                           health_check_interval=0, **credentials)
        self._sweep_pending = self.private and self.url not in _swept_urls
        _swept_urls.add(self.url)
        atexit.register(_close_at_exit, weakref.ref(self))
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self._clock = clock
        self._backoff_s = 0.0      # current backoff; 0 while the server answers
        self._down_until_s = 0.0   # clock time before which the server is not tried

    def _rkey(self, key: Key) -> bytes:
        return self.key_prefix + key_bytes(key)

    def _unavailable(self) -> str | None:
        return "throttled" if self._clock() < self._down_until_s else None

    def _call(self, fn, *args, **kwargs):
        """Run one redis command; map its failure to TierError, track up/down."""
        if self._sweep_pending:           # once per server and process, on first use
            self._sweep_pending = False
            try:
                sweep_dead_namespaces(self.client)
            except redis.exceptions.RedisError:
                pass                      # the command below reports the fault
        try:
            result = fn(*args, **kwargs)
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
        self._call(self.client.set, self._rkey(key), data, ex=self.key_ttl_s)

    def _delete(self, key: Key) -> None:
        if self._unavailable() is None:  # a throttled delete is skipped, not counted
            self._call(self.client.unlink, self._rkey(key))

    def close(self) -> None:
        """Best-effort delete of every stored block, then drop the connections.
        Idempotent (it also runs at interpreter exit)."""
        self._release(self.keys())

    def _release(self, owned: list[Key]) -> None:
        """Best-effort delete of the ``owned`` keys from Redis, forget every key, drop
        the connections."""
        keys = [self._rkey(k) for k in owned]
        for start in range(0, len(keys), 512):
            try:
                self.client.unlink(*keys[start:start + 512])
            except redis.exceptions.RedisError:
                break
        for key in self.keys():
            self._forget(key)
        self.client.close()


def _close_at_exit(ref: weakref.ref) -> None:
    tier = ref()
    if tier is not None and len(tier):
        tier.close()
