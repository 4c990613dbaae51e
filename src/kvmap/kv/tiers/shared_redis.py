"""The redis backend, private or shared: ``tiers(redis=URL[, shared=true,
shared_key=env:NAME])``.

Without ``shared`` a level is a :class:`~kvmap.kv.tiers.redis_tier.RedisTier` of this
process alone. With ``shared=true`` it is a :class:`SharedRedisTier`: processes that
run the same model and KV layout (``shared_namespace.py``) and are given the same key
read each other's prefix blocks.

Layout in Redis, under the namespace prefix ``P`` (``kvmap:shared:<fingerprint>:``)::

    P b:<key>   the sealed frame (``shared_frames.seal``)
    P i:<key>   its index entry: layout fingerprint + frame bytes

Only content-addressed keys are shared: the ``bytes`` prefix hashes of
``kvmap.kv.prefix``. Any other key (the pager's ``page/...`` strings, which name one
process's sequence, not content) lives under a private prefix of this process, sealed
with the process key, replaced and deleted as in a private RedisTier -- two processes'
``page/0/...`` must never meet.

The index lives in Redis, not in the process: before a prefix lookup the store calls
:meth:`SharedRedisTier.discover` with the request's block hashes, which reads their
index entries in one MGET and adds those of this layout to the tier's local view (an
entry of another layout is counted ``layout`` and skipped). The tiered store writes
every block it names by hash through to a shared level at once (``TieredStore.publish``),
so a block is visible to peers as soon as it is computed, not only when the pool
evicts it.

Lifetime -- who may delete shared keys: no tier does. Both keys of a block carry the
TTL ``key_ttl_s``, set by the write and refreshed by every hit, so a namespace nobody
reads expires on its own; Redis's own ``maxmemory`` policy may drop keys earlier (a
later read is then a ``lost`` miss). A process's ``redis_size`` bounds only its local
view: evicting from it, closing the tier or refusing a bad frame forgets the key here
and leaves it in Redis (a peer with another key must not be able to wipe the pool).
Only an operator clears a namespace, with :func:`clear_namespace`.
"""
from __future__ import annotations

from kvmap.kv.tiers.auth import FrameAuth
from kvmap.kv.tiers.base import Key, TierError, key_bytes
from kvmap.kv.tiers.redis_tier import RedisTier, private_prefix
from kvmap.kv.tiers.shared_frames import index_entry, open_sealed, read_index_entry, seal
from kvmap.kv.tiers.shared_namespace import (
    namespace_prefix, shared_auth_key)

MAX_REFUSED_KEYS = 65536     # keys remembered as unreadable, so they are not re-fetched


class SharedRedisTier(RedisTier):
    """A redis level shared between processes (see the module docstring). Keyword
    arguments are RedisTier's, less ``key_prefix`` (the namespace decides it), plus
    ``shared_key`` (``env:NAME``) and ``layout_fingerprint`` (from the tiered store)."""

    shared = True
    authenticate = False       # the tag travels in the sealed value, not in our index

    def __init__(self, capacity_bytes: int, eviction="lru", on_evict=None, *,
                 shared_key: str, layout_fingerprint: bytes | None = None, **kwargs) -> None:
        if layout_fingerprint is None:
            raise ValueError("a shared redis tier needs layout_fingerprint (the tiered "
                             "store derives it from the model and the KV layout)")
        if "key_prefix" in kwargs:
            raise ValueError("a shared redis tier's key prefix is its namespace; "
                             "key_prefix cannot be given")
        self._seal_auth = FrameAuth(shared_auth_key(shared_key))
        self._private_auth = FrameAuth()               # this process's key
        self._private_prefix = private_prefix().encode()
        self.fingerprint = layout_fingerprint
        self._refused: set[Key] = set()
        super().__init__(capacity_bytes, eviction, on_evict,
                         key_prefix=namespace_prefix(layout_fingerprint), **kwargs)

    def _rkey(self, key: Key) -> bytes:
        if not isinstance(key, bytes):                 # not content-addressed: private
            return self._private_prefix + key_bytes(key)
        return self.key_prefix + b"b:" + key_bytes(key)

    def _auth_of(self, key: Key) -> FrameAuth:
        return self._seal_auth if isinstance(key, bytes) else self._private_auth

    def _ikey(self, key: Key) -> bytes:
        return self.key_prefix + b"i:" + key_bytes(key)

    def discover(self, keys) -> None:
        """Add to the local view the ``keys`` that a process of this layout stored."""
        new = [k for k in dict.fromkeys(keys) if isinstance(k, bytes)
               and k not in self._sizes and k not in self._refused]
        if not new or self._count_unavailable():
            return
        try:
            entries = self._call(self.client.mget, [self._ikey(k) for k in new])
        except TierError as e:
            self.stats.errors[e.kind] += 1
            return
        for key, entry in zip(new, entries):
            parsed = read_index_entry(entry) if entry is not None else None
            if entry is not None and parsed is None:
                self.stats.errors["corrupt"] += 1
            if parsed is None:
                continue
            fingerprint, size_bytes = parsed
            if fingerprint != self.fingerprint:
                self.stats.errors["layout"] += 1
                self._refuse(key)
            elif size_bytes <= self.capacity_bytes:
                self._make_room(key, size_bytes)
                self._sizes[key] = size_bytes
                self._used_bytes += size_bytes
                self.order.insert(key)

    def get(self, key: Key) -> bytes | None:
        data = super().get(key)
        if data is None and key in self._refused and key in self._sizes:
            self._forget(key)          # a layout or shape refusal: not ours to read
        return data

    def put(self, key: Key, data: bytes) -> bool:
        """Hash keys name content: a block the namespace holds is not written again,
        and a key this process could not read is not overwritten (see ``_write``)."""
        if key in self._sizes and isinstance(key, bytes):
            self.order.touch(key)
            return True
        return False if key in self._refused else super().put(key, data)

    def _read(self, key: Key) -> bytes | None:
        pipe = self.client.pipeline(transaction=False)
        pipe.getex(self._rkey(key), ex=self.key_ttl_s)      # a hit keeps it alive
        if isinstance(key, bytes):
            pipe.expire(self._ikey(key), self.key_ttl_s)
        data = self._call(pipe.execute)[0]
        if data is None:
            return None
        try:
            return open_sealed(self._auth_of(key), key_bytes(key), self.fingerprint, data)
        except TierError:
            self._refuse(key)
            raise

    def _write(self, key: Key, data: bytes) -> None:
        """Frame and entry in one transaction, each only if absent: the first writer of
        a block wins, so a peer given another key cannot replace the pool's frames."""
        sealed = seal(self._auth_of(key), key_bytes(key), self.fingerprint, data)
        if not isinstance(key, bytes):
            self._call(self.client.set, self._rkey(key), sealed, ex=self.key_ttl_s)
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self._rkey(key), sealed, ex=self.key_ttl_s, nx=True)
        pipe.set(self._ikey(key), index_entry(self.fingerprint, len(data)),
                 ex=self.key_ttl_s, nx=True)
        self._call(pipe.execute)

    def _delete(self, key: Key) -> None:
        """Shared keys are left to their TTL (see the module docstring)."""
        if not isinstance(key, bytes):
            super()._delete(key)

    def close(self) -> None:
        """Delete this process's private keys, forget the local view, drop the
        connections; Redis keeps the shared blocks."""
        self._release([k for k in self.keys() if not isinstance(k, bytes)])

    def _refuse(self, key: Key) -> None:
        if isinstance(key, bytes) and len(self._refused) < MAX_REFUSED_KEYS:
            self._refused.add(key)


def clear_namespace(client, fingerprint: bytes) -> int:
    """Operator's delete: every key of the shared namespace of ``fingerprint``, through
    the redis-py ``client``. Returns the number of keys deleted."""
    match = namespace_prefix(fingerprint) + "*"
    keys = list(client.scan_iter(match=match, count=1000))
    return sum(client.unlink(*keys[i:i + 512]) for i in range(0, len(keys), 512))
