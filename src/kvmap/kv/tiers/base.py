"""The tier interface: a byte-bounded key -> bytes store with an eviction order.

Tiers know bytes, never the pool. A value is one serialized block (a ``serde`` frame);
a key is ``str`` or ``bytes`` (``"a"`` and ``b"a"`` are different keys). The base class
does the plumbing -- size accounting, eviction, stats, turning storage faults into
misses -- and a subclass overrides three storage hooks:

- ``_read(key) -> bytes | None``  None: the storage lost a key the index still had.
- ``_write(key, data)``           store or replace.
- ``_delete(key)``                remove; a missing key is not an error.

A hook reports a fault by raising ``TierError(kind)``; the base class counts it in
``stats.errors[kind]`` and answers a miss or a failed put. Nothing a storage backend
does (disk full, corruption, a dead server) is raised to the caller.

Tiers that store outside the process (``authenticate = True``: disk, redis) keep a keyed
BLAKE2b tag of each value in the index (``auth.py``) and refuse, as a miss counted
``auth``, bytes that do not match it: tampered, moved, replayed or forged frames. A frame
whose CRC fails is counted ``corrupt`` first. ``stats.num_errors`` totals every kind.

Demotion: when a put needs room, victims chosen by the eviction order are removed and,
if ``on_evict`` is set, handed to it as ``on_evict(key, data)`` once the put is done --
the tiered store wires ``upper.on_evict = lower.put``. Not thread-safe.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Union

from kvmap.kv.tiers import serde
from kvmap.kv.tiers.auth import FrameAuth
from kvmap.metrics import percentile
from kvmap.kv.tiers.eviction import EvictionOrder, make_eviction_order

Key = Union[str, bytes]
EvictCallback = Callable[[Key, bytes], object]
LATENCY_WINDOW = 65536  # latencies kept for percentiles (the most recent ones)


class TierError(Exception):
    """A storage fault of kind ``kind`` (e.g. "disk_full", "timeout", "oom")."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


def _percentile_s(values, q: float) -> float:
    """``kvmap.metrics.percentile``, nan instead of None when there are no latencies (the
    flat tier record keeps a float in every field)."""
    value = percentile(values, q)
    return float("nan") if value is None else value


@dataclass
class TierStats:
    """Counters of one tier. Latencies are wall seconds of storage calls: reads of
    hits, writes of successful puts (the most recent ``LATENCY_WINDOW`` of each for the
    percentiles; ``read_s`` and ``write_s`` total them all)."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    evictions: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_s: float = 0.0
    write_s: float = 0.0
    read_latencies_s: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    write_latencies_s: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    errors: Counter = field(default_factory=Counter)

    @property
    def num_errors(self) -> int:
        """Every counted fault, all kinds together."""
        return sum(self.errors.values())

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def as_dict(self) -> dict:
        """A flat record: counters, hit rate, IO seconds (``io_s`` = reads + writes),
        read/write P50 and P99 in seconds."""
        return {"num_hits": self.hits, "num_misses": self.misses, "num_puts": self.puts,
                "num_evictions": self.evictions, "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written, "hit_rate": self.hit_rate,
                "read_s": self.read_s, "write_s": self.write_s,
                "io_s": self.read_s + self.write_s,
                "read_p50_s": _percentile_s(self.read_latencies_s, 50),
                "read_p99_s": _percentile_s(self.read_latencies_s, 99),
                "write_p50_s": _percentile_s(self.write_latencies_s, 50),
                "write_p99_s": _percentile_s(self.write_latencies_s, 99),
                "errors": dict(self.errors), "num_errors": self.num_errors}


class Tier:
    """Base tier. ``capacity_bytes`` bounds the sum of stored value lengths."""

    name: ClassVar[str] = ""
    verify_reads: ClassVar[bool] = False  # check each frame's CRC on get
    authenticate: ClassVar[bool] = False  # check each value's keyed tag on get
    shared: ClassVar[bool] = False        # other processes read and write it too

    def __init__(self, capacity_bytes: int, eviction: str | EvictionOrder = "lru",
                 on_evict: EvictCallback | None = None, auth_key: bytes | None = None
                 ) -> None:
        if not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes={capacity_bytes!r} must be a positive int")
        self.capacity_bytes = capacity_bytes
        self.order = make_eviction_order(eviction) if isinstance(eviction, str) else eviction
        self.on_evict = on_evict
        self.stats = TierStats()
        self._sizes: dict[Key, int] = {}  # resident key -> stored bytes
        self._tags: dict[Key, bytes] = {}  # resident key -> auth tag (authenticate only)
        self._auth = FrameAuth(auth_key) if self.authenticate else None
        self._used_bytes = 0

    # ---- storage hooks ----------------------------------------------------------------
    def _read(self, key: Key) -> bytes | None: raise NotImplementedError
    def _write(self, key: Key, data: bytes) -> None: raise NotImplementedError
    def _delete(self, key: Key) -> None: raise NotImplementedError

    def _unavailable(self) -> str | None:
        """An error kind if the backend must not be tried now (e.g. reconnect throttle)."""
        return None

    def close(self) -> None:
        """Release the backend; the base class has nothing to release."""

    def discover(self, keys: list[Key]) -> None:
        """Learn which of ``keys`` other processes stored (a shared tier's index lives
        outside the process); a private tier's index is complete, so nothing."""

    # ---- public API -------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    def __len__(self) -> int:
        return len(self._sizes)

    def contains(self, key: Key) -> bool:
        """Whether the index holds ``key``; no I/O, no effect on the eviction order."""
        return key in self._sizes

    def keys(self) -> list[Key]:
        return list(self._sizes)

    def get(self, key: Key) -> bytes | None:
        """The bytes stored under ``key`` and a hit, or None and a miss. A fault, a lost
        key or a corrupt frame is a miss counted in ``stats.errors``; the latter two
        also drop the key."""
        _check_key(key)
        if key not in self._sizes or self._count_unavailable():
            self.stats.misses += 1
            return None
        start_s = time.perf_counter()
        try:
            data = self._checked_read(key)
        except TierError as e:
            self.stats.errors[e.kind] += 1
            if e.kind == "auth":
                self.delete(key)
            data = None
        except serde.DECODE_ERRORS:       # CorruptBlockError, or a backend's odd answer
            self.stats.errors["corrupt"] += 1
            self.delete(key)
            data = None
        else:
            if data is None:
                self.stats.errors["lost"] += 1
                self._forget(key)
        if data is None:
            self.stats.misses += 1
            return None
        elapsed_s = time.perf_counter() - start_s
        self.stats.read_latencies_s.append(elapsed_s)
        self.stats.read_s += elapsed_s
        self.stats.hits += 1
        self.stats.bytes_read += len(data)
        self.order.touch(key)
        return data

    def put(self, key: Key, data: bytes) -> bool:
        """Store ``data`` under ``key`` (replacing any old value), evicting as needed.
        False if it is larger than the tier, the backend is unavailable or the write
        fails; a failed put leaves no old value behind. Victims go to ``on_evict``.
        ValueError for a bad key, non-bytes data, or (tiers that check frames) data
        that is not a serde frame."""
        _check_key(key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"data for key {key!r} is a {type(data).__name__}, not bytes")
        data = bytes(data)
        if self.verify_reads:
            serde.peek_header(data)  # reject non-frames now, not as "corrupt" later
        tag = self._auth.tag(key_bytes(key), data) if self._auth is not None else None
        if len(data) > self.capacity_bytes:
            self.stats.errors["too_large"] += 1
            self.delete(key)
            return False
        if self._count_unavailable():
            return False
        was_resident = key in self._sizes
        if was_resident:
            self.order.touch(key)
        evicted = self._make_room(key, len(data))
        start_s = time.perf_counter()
        try:
            self._write(key, data)
        except TierError as e:
            self.stats.errors[e.kind] += 1
            self._tags.pop(key, None)
            if key in self._sizes:
                self._forget(key)
            if was_resident:
                self._delete_quietly(key)
            self._notify(evicted)
            return False
        elapsed_s = time.perf_counter() - start_s
        self.stats.write_latencies_s.append(elapsed_s)
        self.stats.write_s += elapsed_s
        if key in self._sizes:
            self._used_bytes -= self._sizes[key]
        else:
            self.order.insert(key)
        self._sizes[key] = len(data)
        if tag is not None:
            self._tags[key] = tag
        self._used_bytes += len(data)
        self.stats.puts += 1
        self.stats.bytes_written += len(data)
        self._notify(evicted)
        return True

    def delete(self, key: Key) -> bool:
        """Remove ``key``; True if it was resident. Backend faults are counted only."""
        if key not in self._sizes:
            return False
        self._forget(key)
        self._delete_quietly(key)
        return True

    def check_integrity(self) -> None:
        assert self._used_bytes == sum(self._sizes.values()), "used_bytes drifted"
        assert self._used_bytes <= self.capacity_bytes, "over capacity"
        assert len(self.order) == len(self._sizes), "order and index disagree"
        assert self._auth is None or self._tags.keys() == self._sizes.keys(), \
            "tags and index disagree"
        assert all(k in self.order for k in self._sizes), "index key not in order"
        self.order.check_integrity()

    # ---- plumbing ---------------------------------------------------------------------
    def _make_room(self, key: Key, size_bytes: int) -> list[tuple[Key, bytes]]:
        """Evict until ``size_bytes`` fits next to everything but ``key``'s old value.
        Returns the victims' (key, data) to demote, read only if ``on_evict`` is set."""
        evicted = []
        while self._used_bytes - self._sizes.get(key, 0) + size_bytes > self.capacity_bytes:
            victim = self.order.victim(incoming=key)
            self._used_bytes -= self._sizes.pop(victim)
            if victim == key:  # the old value of the key being replaced
                continue
            self.stats.evictions += 1
            data = self._read_quietly(victim) if self.on_evict else None
            self._tags.pop(victim, None)
            self._delete_quietly(victim)
            if data is not None:
                evicted.append((victim, data))
        return evicted

    def _forget(self, key: Key) -> None:
        self._used_bytes -= self._sizes.pop(key)
        self._tags.pop(key, None)
        self.order.remove(key)

    def _checked_read(self, key: Key) -> bytes | None:
        """``_read`` plus the CRC (``verify_reads``) and the tag (``authenticate``)
        checks. Raises TierError("auth") or a serde.DECODE_ERRORS exception."""
        data = self._read(key)
        if data is None:
            return None
        if not isinstance(data, bytes):
            raise serde.CorruptBlockError("length", f"backend returned a "
                                                    f"{type(data).__name__}")
        if self.verify_reads:
            serde.verify(data)
        if self._auth is not None and not self._auth.check(key_bytes(key), data,
                                                           self._tags.get(key, b"")):
            raise TierError("auth", f"value of {key!r} does not match the tag of its put")
        return data

    def _read_quietly(self, key: Key) -> bytes | None:
        try:
            return self._checked_read(key)
        except TierError as e:
            self.stats.errors[e.kind] += 1
        except serde.DECODE_ERRORS:
            self.stats.errors["corrupt"] += 1
        return None

    def _delete_quietly(self, key: Key) -> None:
        try:
            self._delete(key)
        except TierError as e:
            self.stats.errors[e.kind] += 1

    def _count_unavailable(self) -> bool:
        kind = self._unavailable()
        if kind is not None:
            self.stats.errors[kind] += 1
        return kind is not None

    def _notify(self, evicted: list[tuple[Key, bytes]]) -> None:
        for key, data in evicted:
            self.on_evict(key, data)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.used_bytes}/{self.capacity_bytes} bytes, "
                f"{len(self)} blocks, {self.order.name})")


def _check_key(key: Key) -> None:
    if not isinstance(key, (str, bytes)) or not key:
        raise ValueError(f"tier key {key!r} must be a non-empty str or bytes")


def key_bytes(key: Key) -> bytes:
    """A typed, injective byte form of a key (b"s:" + utf-8 or b"b:" + raw bytes), for
    backends that name things by bytes."""
    return b"s:" + key.encode() if isinstance(key, str) else b"b:" + key
