"""Eviction orders: which resident key a full tier gives up next.

An order tracks keys only (never bytes or sizes); the tier owns the byte bound and asks
for victims one at a time until the incoming block fits. Contract, for every order:

- ``insert(key)``  a key becomes resident (a miss that is now stored). ValueError if
  it already is.
- ``touch(key)``   a resident key was hit. ValueError if it is not resident.
- ``remove(key)``  a resident key was deleted by the caller; forgotten entirely.
- ``victim(incoming=None) -> key``  choose a resident key, make it non-resident and
  return it. ``incoming`` is the key about to be inserted (ARC uses it); the tier then
  deletes the victim's bytes. LookupError when nothing is resident.

Orders are not thread-safe; the tier that owns one serializes calls. Each registers
itself in ``EVICTION_ORDERS`` (``tiers(evict=...)``, and the simulator's tiers, find it
there).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

from kvmap.registry import Registry

Key = Hashable


class EvictionOrder:
    name = ""

    def insert(self, key: Key) -> None: raise NotImplementedError
    def touch(self, key: Key) -> None: raise NotImplementedError
    def remove(self, key: Key) -> None: raise NotImplementedError
    def victim(self, incoming: Key | None = None) -> Key: raise NotImplementedError
    def __len__(self) -> int: raise NotImplementedError
    def __contains__(self, key: Key) -> bool: raise NotImplementedError

    def check_integrity(self) -> None:
        """Raise AssertionError if internal structures disagree."""

    def _not_resident(self, key: Key) -> ValueError:
        return ValueError(f"{self.name}: key {key!r} is not resident")


# name -> EvictionOrder subclass
EVICTION_ORDERS: Registry[type[EvictionOrder]] = Registry("eviction order")


@EVICTION_ORDERS.register
class LRU(EvictionOrder):
    """Least recently used: the victim is the key whose last insert or hit is oldest."""

    name = "lru"

    def __init__(self) -> None:
        self._keys: OrderedDict[Key, None] = OrderedDict()  # oldest first

    def __len__(self) -> int: return len(self._keys)
    def __contains__(self, key: Key) -> bool: return key in self._keys

    def insert(self, key: Key) -> None:
        if key in self._keys:
            raise ValueError(f"lru: key {key!r} is already resident")
        self._keys[key] = None

    def touch(self, key: Key) -> None:
        if key not in self._keys:
            raise self._not_resident(key)
        self._keys.move_to_end(key)

    def remove(self, key: Key) -> None:
        if self._keys.pop(key, self) is self:
            raise self._not_resident(key)

    def victim(self, incoming: Key | None = None) -> Key:
        if not self._keys:
            raise LookupError("lru: no resident key to evict")
        return self._keys.popitem(last=False)[0]


@EVICTION_ORDERS.register
class LFU(EvictionOrder):
    """Least frequently used, ties broken by least recent use. A key's count starts at 1
    on insert and grows by 1 per hit; counts never decay and are forgotten on eviction.

    ``_buckets[count]`` holds the keys with that count, oldest last-use first: a key
    enters a bucket on the hit that gave it that count, so arrival order is use order.
    """

    name = "lfu"

    def __init__(self) -> None:
        self._counts: dict[Key, int] = {}
        self._buckets: dict[int, OrderedDict[Key, None]] = {}

    def __len__(self) -> int: return len(self._counts)
    def __contains__(self, key: Key) -> bool: return key in self._counts

    def _unlink(self, key: Key) -> int:
        count = self._counts.pop(key)
        bucket = self._buckets[count]
        del bucket[key]
        if not bucket:
            del self._buckets[count]
        return count

    def _link(self, key: Key, count: int) -> None:
        self._counts[key] = count
        self._buckets.setdefault(count, OrderedDict())[key] = None

    def insert(self, key: Key) -> None:
        if key in self._counts:
            raise ValueError(f"lfu: key {key!r} is already resident")
        self._link(key, 1)

    def touch(self, key: Key) -> None:
        if key not in self._counts:
            raise self._not_resident(key)
        self._link(key, self._unlink(key) + 1)

    def remove(self, key: Key) -> None:
        if key not in self._counts:
            raise self._not_resident(key)
        self._unlink(key)

    def victim(self, incoming: Key | None = None) -> Key:
        if not self._counts:
            raise LookupError("lfu: no resident key to evict")
        key = next(iter(self._buckets[min(self._buckets)]))
        self._unlink(key)
        return key

    def check_integrity(self) -> None:
        in_buckets = {k: c for c, b in self._buckets.items() for k in b}
        assert in_buckets == self._counts, "lfu: buckets disagree with counts"
        assert all(self._buckets.values()), "lfu: empty bucket kept"


@EVICTION_ORDERS.register
class ARC(EvictionOrder):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), on keys.

    Resident keys live in T1 (seen once recently) or T2 (seen at least twice); B1 and B2
    remember keys recently evicted from T1 and T2 ("ghosts", no data). ``p`` is the
    adaptive target size of T1: a miss that hits a B1 ghost says T1 was too small (p
    grows), a B2 ghost says T2 was (p shrinks). A one-pass scan only ever fills T1, so
    it cannot flush the twice-used keys in T2 -- the scan resistance LRU lacks.

    The paper counts a fixed cache size c in pages; a byte-bounded tier holds a varying
    number of blocks, so here c is the number of resident keys (at least 1) and ghost
    lists are trimmed to |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.
    """

    name = "arc"

    def __init__(self) -> None:
        self.t1: OrderedDict[Key, None] = OrderedDict()  # each list: LRU end first
        self.t2: OrderedDict[Key, None] = OrderedDict()
        self.b1: OrderedDict[Key, None] = OrderedDict()
        self.b2: OrderedDict[Key, None] = OrderedDict()
        self.p = 0.0  # target |T1|, in keys
        self._adapted_for: list[Key] = []  # the incoming key p was already adapted to

    def __len__(self) -> int: return len(self.t1) + len(self.t2)
    def __contains__(self, key: Key) -> bool: return key in self.t1 or key in self.t2

    def _adapt(self, key: Key) -> None:
        """The paper's Case II/III update of p, once per incoming ghost key."""
        if self._adapted_for == [key]:
            return
        c = max(1, len(self))
        if key in self.b1:
            self.p = min(float(c), self.p + max(1.0, len(self.b2) / len(self.b1)))
        elif key in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
        self._adapted_for = [key]

    def insert(self, key: Key) -> None:
        if key in self:
            raise ValueError(f"arc: key {key!r} is already resident")
        if key in self.b1 or key in self.b2:  # ghost hit: seen before, goes to T2
            self._adapt(key)
            self.b1.pop(key, None)
            self.b2.pop(key, None)
            self.t2[key] = None
        else:
            self.t1[key] = None
        self._adapted_for = []
        self._trim_ghosts()

    def touch(self, key: Key) -> None:
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
        elif key in self.t2:
            self.t2.move_to_end(key)
        else:
            raise self._not_resident(key)

    def remove(self, key: Key) -> None:
        if self.t1.pop(key, self) is self and self.t2.pop(key, self) is self:
            raise self._not_resident(key)

    def victim(self, incoming: Key | None = None) -> Key:
        """The paper's REPLACE: evict T1's LRU key into B1 if T1 exceeds its target p
        (or equals it and ``incoming`` is a B2 ghost), else T2's LRU key into B2."""
        if not self:
            raise LookupError("arc: no resident key to evict")
        in_b2 = incoming is not None and incoming in self.b2
        if incoming is not None and (incoming in self.b1 or in_b2):
            self._adapt(incoming)
        if self.t1 and (not self.t2 or len(self.t1) > self.p
                        or (in_b2 and len(self.t1) >= self.p)):
            key = self.t1.popitem(last=False)[0]
            self.b1[key] = None
        else:
            key = self.t2.popitem(last=False)[0]
            self.b2[key] = None
        return key

    def _trim_ghosts(self) -> None:
        c = max(1, len(self))
        while self.b1 and len(self.t1) + len(self.b1) > c:
            self.b1.popitem(last=False)
        while (self.b1 or self.b2) and len(self) + len(self.b1) + len(self.b2) > 2 * c:
            (self.b2 or self.b1).popitem(last=False)

    def check_integrity(self) -> None:
        lists = [set(self.t1), set(self.t2), set(self.b1), set(self.b2)]
        assert sum(map(len, lists)) == len(set().union(*lists)), "arc: lists overlap"
        assert self.p >= 0.0, f"arc: p={self.p} is negative"


def make_eviction_order(name: str) -> EvictionOrder:
    """A fresh order by its name: one of ``EVICTION_ORDERS``."""
    if name not in EVICTION_ORDERS:
        raise ValueError(f"eviction order {name!r} is unknown; "
                         f"choose one of {sorted(EVICTION_ORDERS)}")
    return EVICTION_ORDERS[name]()
