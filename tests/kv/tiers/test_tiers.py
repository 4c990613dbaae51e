"""The tier matrix: host / disk / redis x lru / lfu / arc, on serialized blocks."""
from __future__ import annotations

import math

import pytest
import torch

from kvmap.kv.tiers import TIER_BACKENDS
from kvmap.kv.tiers.base import Tier
from kvmap.kv.tiers.disk import DiskTier
from kvmap.kv.tiers.eviction import EVICTION_ORDERS
from kvmap.kv.tiers.host import HostTier
from kvmap.kv.tiers.serde import decode_block, encode_block

PAYLOAD_BYTES = 1000
FRAME_BYTES = len(encode_block([{"k": torch.zeros(PAYLOAD_BYTES, dtype=torch.uint8)}]))


def frame(seed: int, payload_bytes: int = PAYLOAD_BYTES) -> bytes:
    """A one-layer block of ``payload_bytes`` random bytes, serialized."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, 256, (payload_bytes,), dtype=torch.uint8, generator=g)
    return encode_block([{"k": t}])


# One row per tier backend: its constructor keywords in a test, and how many blocks it
# really holds, counted from the backend itself (not from the tier's own index).
TIER_ROWS = {
    "host": (lambda request: {}, lambda tier: len(tier._data)),
    "disk": (lambda request: {"directory": request.getfixturevalue("tmp_path")},
             lambda tier: len(list(tier.directory.glob("*.kvb")))),
    "redis": (lambda request: {"url": request.getfixturevalue("redis_url")},
              lambda tier: len(list(tier.client.scan_iter(match=tier.key_prefix + b"*")))),
}
TIER_NAMES = [pytest.param(name, marks=pytest.mark.redis) if name == "redis" else name
              for name in TIER_ROWS]


def test_every_registered_backend_has_a_row():
    assert sorted(TIER_ROWS) == sorted(TIER_BACKENDS)


def make_tier(kind: str, capacity_bytes: int, eviction: str, request, **kw) -> Tier:
    """A ``kind`` tier built by its registered backend, closed at the test's end."""
    tier = TIER_BACKENDS[kind].create(capacity_bytes, eviction,
                                      **TIER_ROWS[kind][0](request), **kw)
    request.addfinalizer(tier.close)
    return tier


def stored_count(tier: Tier) -> int:
    return TIER_ROWS[tier.name][1](tier)


EVICTION_ROWS = tuple(EVICTION_ORDERS)          # every registered order


@pytest.fixture(params=EVICTION_ROWS)
def eviction(request):
    return request.param


@pytest.fixture(params=TIER_NAMES)
def kind(request):
    return request.param


def test_round_trip_is_bit_exact(kind, eviction, request):
    tier = make_tier(kind, 1 << 20, eviction, request)
    block = [{"k": torch.randn(16, 3, 64).bfloat16(), "v": torch.randn(16, 3, 64).bfloat16()}
             for _ in range(2)]
    data = encode_block(block)
    assert tier.put(b"\x00hash", data) and tier.contains(b"\x00hash")
    assert not tier.contains("\x00hash")  # str and bytes keys are distinct
    got = tier.get(b"\x00hash")
    assert got == data
    out = decode_block(got)
    assert all(torch.equal(out[i][n].view(torch.uint8), block[i][n].view(torch.uint8))
               for i in range(2) for n in ("k", "v"))


def test_bound_is_respected_and_victims_are_demoted(kind, eviction, request):
    demoted = []
    tier = make_tier(kind, 4 * FRAME_BYTES, eviction, request,
                     on_evict=lambda k, d: demoted.append((k, d)))
    blocks = {f"b{i}": frame(i) for i in range(10)}
    for key, data in blocks.items():
        assert tier.put(key, data)
        assert tier.used_bytes <= tier.capacity_bytes
        tier.check_integrity()
    assert len(tier) == stored_count(tier) == 4 and tier.used_bytes == 4 * FRAME_BYTES
    assert [k for k, _ in demoted] == [f"b{i}" for i in range(6)]  # no hits: FIFO for all
    assert all(d == blocks[k] for k, d in demoted)
    assert tier.stats.evictions == 6


# put a; get a; put b, c, d (capacity 4); put e -> who goes?
# LRU: a (used before b, c, d); LFU: b (count 1, oldest); ARC: b (T1 LRU; a is in T2).
FIRST_VICTIM = {"lru": "a", "lfu": "b", "arc": "b"}


def test_eviction_order_picks_the_expected_victim(kind, eviction, request):
    demoted = []
    tier = make_tier(kind, 4 * FRAME_BYTES, eviction, request,
                     on_evict=lambda k, d: demoted.append(k))
    tier.put("a", frame(0))
    assert tier.get("a") is not None
    for i, key in enumerate("bcde"):
        tier.put(key, frame(i + 1))
    assert demoted == [FIRST_VICTIM[eviction]]
    assert not tier.contains(FIRST_VICTIM[eviction]) and tier.get(demoted[0]) is None


def test_stats_are_counted(kind, eviction, request):
    tier = make_tier(kind, 3 * FRAME_BYTES, eviction, request)
    for i in range(4):
        tier.put(f"b{i}", frame(i))
    hits = [tier.get(f"b{i}") is not None for i in range(4)] + [tier.get("nope") is not None]
    s = tier.stats
    assert hits == [False, True, True, True, False]
    assert (s.hits, s.misses, s.puts, s.evictions) == (3, 2, 4, 1)
    assert s.bytes_written == 4 * FRAME_BYTES and s.bytes_read == 3 * FRAME_BYTES
    assert len(s.read_latencies_s) == 3 and len(s.write_latencies_s) == 4
    record = s.as_dict()
    assert record["hit_rate"] == pytest.approx(0.6) and record["errors"] == {}
    assert 0 < record["read_p50_s"] <= record["read_p99_s"] and math.isfinite(record["write_p99_s"])


def test_overwrite_delete_and_too_large(kind, eviction, request):
    tier = make_tier(kind, 2 * FRAME_BYTES, eviction, request)
    tier.put("a", frame(0))
    small = frame(1, payload_bytes=10)
    assert tier.put("a", small) and tier.get("a") == small and tier.used_bytes == len(small)
    assert not tier.put("a", frame(2, payload_bytes=3 * PAYLOAD_BYTES))
    assert tier.stats.errors["too_large"] == 1 and not tier.contains("a")  # no stale value
    tier.put("b", frame(3))
    assert tier.delete("b") and not tier.delete("b") and tier.used_bytes == 0
    assert stored_count(tier) == 0
    tier.check_integrity()


def test_bad_arguments_raise_value_error_naming_them(kind, request):
    tier = make_tier(kind, FRAME_BYTES, "lru", request)
    with pytest.raises(ValueError, match="42"):
        tier.put(42, frame(0))
    with pytest.raises(ValueError, match="list"):
        tier.put("a", [1, 2])
    with pytest.raises(ValueError, match="-1"):
        HostTier(-1)


@pytest.mark.parametrize("kind", ["disk", pytest.param("redis", marks=pytest.mark.redis)])
def test_checked_tiers_reject_bytes_that_are_not_a_frame(kind, request):
    tier = make_tier(kind, FRAME_BYTES, "lru", request)
    with pytest.raises(ValueError, match="magic"):
        tier.put("a", b"x" * 64)


def test_host_to_disk_demotion_chain(tmp_path):
    disk = DiskTier(10 * FRAME_BYTES, "lru", directory=tmp_path)
    host = HostTier(2 * FRAME_BYTES, "arc", on_evict=disk.put)
    blocks = {f"b{i}": frame(i) for i in range(5)}
    for key, data in blocks.items():
        host.put(key, data)
    assert sorted(host.keys()) == ["b3", "b4"] and sorted(disk.keys()) == ["b0", "b1", "b2"]
    assert all(disk.get(k) == blocks[k] for k in ("b0", "b1", "b2"))
    disk.close()
