"""Eviction orders: the shared contract, each order's choice, ARC's scan resistance."""
from __future__ import annotations

import random

import pytest

from kvmap.kv.tiers.eviction import ARC, EVICTION_ORDERS, LFU, LRU, make_eviction_order


def simulate(order, trace, capacity_keys: int) -> list[bool]:
    """Run ``trace`` through a cache of ``capacity_keys`` entries; hit flag per access."""
    hits = []
    for key in trace:
        if key in order:
            order.touch(key)
            hits.append(True)
            continue
        if len(order) >= capacity_keys:
            order.victim(incoming=key)
        order.insert(key)
        hits.append(False)
        order.check_integrity()
    return hits


@pytest.mark.parametrize("name", EVICTION_ORDERS)
def test_contract_errors(name):
    order = make_eviction_order(name)
    with pytest.raises(LookupError):
        order.victim()
    order.insert("a")
    with pytest.raises(ValueError, match="'a'"):
        order.insert("a")
    for call in (order.touch, order.remove):
        with pytest.raises(ValueError, match="'zz'"):
            call("zz")
    assert order.victim() == "a" and "a" not in order and len(order) == 0


@pytest.mark.parametrize("name", EVICTION_ORDERS)
def test_random_operations_keep_residency_exact(name):
    order, resident, rng = make_eviction_order(name), set(), random.Random(0)
    for _ in range(2000):
        key = rng.randrange(40)
        op = rng.random()
        if key in resident and op < 0.6:
            order.touch(key)
        elif key in resident and op < 0.7:
            order.remove(key)
            resident.discard(key)
        elif key not in resident:
            if len(resident) >= 12:
                victim = order.victim(incoming=key)
                assert victim in resident and victim not in order
                resident.discard(victim)
            order.insert(key)
            resident.add(key)
        assert len(order) == len(resident) and all(k in order for k in resident)
        order.check_integrity()


def test_unknown_order_is_named():
    with pytest.raises(ValueError, match="'fifo'"):
        make_eviction_order("fifo")


def test_lru_evicts_least_recently_used():
    order = LRU()
    for k in "abc":
        order.insert(k)
    order.touch("a")
    assert [order.victim() for _ in range(3)] == ["b", "c", "a"]


def test_lfu_evicts_least_frequent_ties_by_least_recent():
    order = LFU()
    for k in "abcd":
        order.insert(k)
    order.touch("a"), order.touch("a"), order.touch("b"), order.touch("c")
    # counts: a=3, b=2, c=2, d=1; b reached 2 before c did
    assert [order.victim() for _ in range(4)] == ["d", "b", "c", "a"]
    order.insert("a")  # a count is forgotten on eviction
    order.insert("e")
    order.touch("e")
    assert order.victim() == "a"


def test_arc_ghost_hit_in_b1_grows_p_and_lands_in_t2():
    order = ARC()
    simulate(order, [1, 2, 1, 2, 3, 4, 5], capacity_keys=4)  # T2=[1,2]; 3 goes to B1
    assert list(order.t1) == [4, 5] and list(order.b1) == [3] and order.p == 0
    simulate(order, [3], capacity_keys=4)  # ghost hit: T1 was too small
    assert order.p == 1 and 3 in order.t2 and list(order.b1) == [4]


def test_arc_resists_a_scan_that_flushes_lru():
    """Hot keys reused every round while a one-pass scan streams through: between two
    uses of a hot key more distinct keys go by than the cache holds, so LRU never hits;
    ARC keeps the twice-seen hot keys in T2 and lets the scan churn through T1."""
    hot, trace = list(range(4)), []
    trace += hot + hot  # warm-up: hot keys seen twice
    scan = iter(range(1000, 10_000))
    for _ in range(30):
        trace += hot + [next(scan) for _ in range(12)]
    measured = slice(8 + 16, None)  # from the second round on
    lru_hits = simulate(LRU(), trace, capacity_keys=10)[measured]
    arc_hits = simulate(ARC(), trace, capacity_keys=10)[measured]
    hot_accesses = 29 * len(hot)
    assert sum(lru_hits) == 0
    assert sum(arc_hits) >= 0.9 * hot_accesses
