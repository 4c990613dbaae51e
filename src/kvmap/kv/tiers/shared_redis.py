"""The redis backend, private or shared: ``tiers(redis=URL[, shared=true,
shared_key=env:NAME])``.

Without ``shared`` a level is a :class:`~kvmap.kv.tiers.redis_tier.RedisTier` of this
process alone. With ``shared=true`` it is a :class:`SharedRedisTier`: processes that
run the same model and KV layout (``shared_namespace.py``) and are given the same key
read each other's prefix blocks.

Layout in Redis, under the namespace prefix ``P`` (``kvmap:shared:<fingerprint>:``)::

    P b:<name>  the sealed frame (``shared_frames.seal``)
    P i:<name>  its index entry: layout fingerprint + frame bytes, tagged
    name        = hex(keyed BLAKE2b(names key, block's prefix hash))

The names are keyed hashes (``shared_namespace.SharedKeys``): whoever reads Redis
without the key cannot test whether a guessed prompt's blocks are there, nor write a
value first under the name a block will take.

Only content-addressed keys are shared: the ``bytes`` prefix hashes of
``kvmap.kv.prefix``. Any other key (the pager's ``page/...`` strings, which name one
process's sequence, not content) lives under a private prefix of this process, sealed
with the process key, replaced and deleted as in a private RedisTier -- two processes'
``page/0/...`` must never meet.

The index lives in Redis, not in the process: before a prefix lookup the store calls
:meth:`SharedRedisTier.discover` with the request's block hashes, which reads their
index entries in one MGET (on the engine thread: one round trip, at most one socket
timeout, then the backoff keeps it off the network) and adds those of this layout to
the tier's local view (an entry of another layout is counted ``layout`` and skipped; one
whose tag fails, ``auth``). The tiered store writes every block it names by hash through
to a shared level at once (``TieredStore.publish``), so a block is visible to peers as
soon as it is computed; the write itself -- sealing and the round trip -- runs on the
tier's writer thread (``shared_writer.py``), never on the engine thread.

A value under one of our names that fails its checks (``auth``, ``corrupt``: garbage
from a writer without the key) is forgotten here and *replaced* by the next put of that
block, since no key holder can have written it; a value of another layout is refused.

Lifetime -- who may delete shared keys: no tier does. Both keys of a block carry the
TTL ``key_ttl_s``, set by the write and refreshed by every hit, so a namespace nobody
reads expires on its own; Redis's own ``maxmemory`` policy may drop keys earlier (a
later read is then a ``lost`` miss). A process's ``redis_size`` bounds only its local
view: evicting from it or closing the tier forgets the key here and leaves it in Redis.
Only an operator clears a namespace, with :func:`clear_namespace`.
"""
from __future__ import annotations

from kvmap.kv.tiers.auth import FrameAuth
from kvmap.kv.tiers.base import Key, TierError, key_bytes
from kvmap.kv.tiers.redis_tier import RedisTier, private_prefix
from kvmap.kv.tiers.shared_frames import index_entry, open_sealed, read_index_entry, seal
from kvmap.kv.tiers.shared_namespace import (
    namespace_prefix, shared_keys)
from kvmap.kv.tiers.shared_writer import SharedWriter

MAX_REFUSED_KEYS = 65536     # keys remembered as unreadable (or to replace): bounded sets
_REPLACEABLE = ("auth", "corrupt")   # under our names: no key holder wrote it


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
        keys = shared_keys(shared_key)
        self._names = keys
        self._seal_auth = FrameAuth(keys.frames)
        self._index_auth = FrameAuth(keys.index)
        self._private_auth = FrameAuth()               # this process's key
        self._private_prefix = private_prefix().encode()
        self.fingerprint = layout_fingerprint
        self._refused: set[Key] = set()                # another layout: never read
        self._replace: set[Key] = set()                # garbage under our name: overwrite
        self._writer = SharedWriter(self._write_shared, self._count_error)
        super().__init__(capacity_bytes, eviction, on_evict,
                         key_prefix=namespace_prefix(layout_fingerprint), **kwargs)

    def _rkey(self, key: Key) -> bytes:
        if not isinstance(key, bytes):                 # not content-addressed: private
            return self._private_prefix + key_bytes(key)
        return self.key_prefix + b"b:" + self._names.name(key_bytes(key))

    def _auth_of(self, key: Key) -> FrameAuth:
        return self._seal_auth if isinstance(key, bytes) else self._private_auth

    def _ikey(self, key: Key) -> bytes:
        return self.key_prefix + b"i:" + self._names.name(key_bytes(key))

    def discover(self, keys) -> None:
        """Add to the local view the ``keys`` that a process of this layout stored."""
        new = [k for k in dict.fromkeys(keys) if isinstance(k, bytes) and k not in self._sizes
               and k not in self._refused and k not in self._replace]
        if not new or self._count_unavailable():
            return
        try:
            entries = self._call(self.client.mget, [self._ikey(k) for k in new])
        except TierError as e:
            self.stats.errors[e.kind] += 1
            return
        for key, entry in zip(new, entries):
            if entry is None:
                continue
            try:
                fingerprint, size_bytes = read_index_entry(self._index_auth,
                                                           key_bytes(key), entry)
            except TierError as e:          # garbage or forged: counted, to be replaced
                self.stats.errors[e.kind] += 1
                self._mark(self._replace, key)
                continue
            if fingerprint != self.fingerprint:
                self.stats.errors["layout"] += 1
                self._mark(self._refused, key)
            elif size_bytes <= self.capacity_bytes:
                self._make_room(key, size_bytes)
                self._sizes[key] = size_bytes
                self._used_bytes += size_bytes
                self.order.insert(key)

    def get(self, key: Key) -> bytes | None:
        data = super().get(key)
        if data is None and key in self._sizes and (key in self._refused
                                                    or key in self._replace):
            self._forget(key)          # refused or to be replaced: not ours to read
        return data

    def delete(self, key: Key) -> bool:
        """Forget ``key`` here (Redis keeps shared blocks: see the module docstring). A
        content key is deleted only when its frame failed a check after it was opened
        (NaN in it, another shape): the next put of that block replaces it."""
        if isinstance(key, bytes):
            self._mark(self._replace, key)
        return super().delete(key)

    def put(self, key: Key, data: bytes) -> bool:
        """Hash keys name content: a block the namespace holds is not written again,
        and one of another layout is left alone (see ``_write``)."""
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
        except TierError as e:
            if isinstance(key, bytes):
                self._mark(self._replace if e.kind in _REPLACEABLE else self._refused, key)
            raise

    def _write(self, key: Key, data: bytes) -> None:
        """A private key: written now. A content key: handed to the writer thread."""
        if not isinstance(key, bytes):
            sealed = seal(self._auth_of(key), key_bytes(key), self.fingerprint, data)
            self._call(self.client.set, self._rkey(key), sealed, ex=self.key_ttl_s)
            return
        replace = key in self._replace
        self._replace.discard(key)
        self._writer.submit((key, data, replace))

    def _write_shared(self, job) -> None:
        """Writer thread: frame and entry in one transaction, each only if absent (the
        first writer of a block wins), or replacing what failed its checks."""
        key, data, replace = job
        sealed = seal(self._seal_auth, key_bytes(key), self.fingerprint, data)
        entry = index_entry(self._index_auth, key_bytes(key), self.fingerprint, len(data))
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self._rkey(key), sealed, ex=self.key_ttl_s, nx=not replace)
        pipe.set(self._ikey(key), entry, ex=self.key_ttl_s, nx=not replace)
        self._call(pipe.execute)

    def _count_error(self, kind: str) -> None:
        self.stats.errors[kind] += 1

    def flush(self, wait_s: float = 10.0) -> None:
        """Wait until the writes queued so far are done (tests, benchmarks)."""
        self._writer.close(wait_s)

    def _delete(self, key: Key) -> None:
        """Shared keys are left to their TTL (see the module docstring)."""
        if not isinstance(key, bytes):
            super()._delete(key)

    def close(self) -> None:
        """Finish the queued writes (within a bound), delete this process's private
        keys, forget the local view, drop the connections; Redis keeps the shared
        blocks."""
        self._writer.close()
        self._release([k for k in self.keys() if not isinstance(k, bytes)])

    @staticmethod
    def _mark(keys: set, key: Key) -> None:
        if len(keys) < MAX_REFUSED_KEYS:
            keys.add(key)


def clear_namespace(client, fingerprint: bytes) -> int:
    """Operator's delete: every key of the shared namespace of ``fingerprint``, through
    the redis-py ``client``. Returns the number of keys deleted."""
    match = namespace_prefix(fingerprint) + "*"
    keys = list(client.scan_iter(match=match, count=1000))
    return sum(client.unlink(*keys[i:i + 512]) for i in range(0, len(keys), 512))
