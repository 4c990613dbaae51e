"""Faults become misses and failed puts, counted by kind -- never exceptions."""
from __future__ import annotations

import errno
import time

import pytest
import torch

from kvmap.kv.tiers import disk as disk_module
from kvmap.kv.tiers.disk import DiskTier
from kvmap.kv.tiers.serde import encode_block


def frame(seed: int, payload_bytes: int = 23_000) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return encode_block([{"k": torch.randint(0, 256, (payload_bytes,), dtype=torch.uint8,
                                             generator=g)}])


@pytest.fixture
def disk(tmp_path):
    tier = DiskTier(1 << 20, "lru", directory=tmp_path)
    yield tier
    tier.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_damaged_disk_file_is_a_counted_miss_and_deleted(disk, damage):
    disk.put("a", frame(0))
    disk.put("b", frame(1))
    path = disk.path_of("a")
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x40
    path.write_bytes(bytes(raw[: len(raw) // 2] if damage == "truncate"
                           else b"" if damage == "empty" else raw))
    assert disk.get("a") is None
    assert disk.stats.errors["corrupt"] == 1 and disk.stats.misses == 1
    assert not path.exists() and not disk.contains("a")
    assert disk.used_bytes == len(frame(1)) and disk.get("b") == frame(1)
    disk.check_integrity()


def test_disk_file_removed_behind_the_tiers_back_is_lost(disk):
    disk.put("a", frame(0))
    disk.path_of("a").unlink()
    assert disk.get("a") is None and disk.stats.errors["lost"] == 1
    assert disk.used_bytes == 0 and not disk.contains("a")


def test_disk_full_fails_the_put_and_leaves_no_temp_file(disk, monkeypatch):
    disk.put("a", frame(0))

    def full(path, mode="r", *args, **kwargs):
        if "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(disk_module, "open", full, raising=False)
    assert disk.put("b", frame(1)) is False
    assert disk.put("a", frame(2)) is False  # a failed overwrite drops the old value
    assert disk.stats.errors["disk_full"] == 2
    assert not disk.contains("a") and disk.used_bytes == 0
    assert list(disk.directory.iterdir()) == []
    monkeypatch.undo()
    assert disk.put("b", frame(1)) and disk.get("b") == frame(1)


# ---- redis -------------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def redis_tier(server, **kw):
    from kvmap.kv.tiers.redis_tier import RedisTier
    return RedisTier(1 << 22, "lru", url=server.url, **kw)


@pytest.mark.redis
def test_redis_killed_mid_run_then_reconnects_after_the_throttle(redis_server):
    clock = FakeClock()
    tier = redis_tier(redis_server, backoff_initial_s=0.1, backoff_max_s=0.3, clock=clock)
    assert tier.put("a", frame(0)) and tier.get("a") == frame(0)

    redis_server.kill()
    start_s = time.perf_counter()
    assert tier.get("a") is None                       # connection refused / reset: miss
    assert tier.stats.errors["connection"] == 1
    assert tier.put("b", frame(1)) is False            # within the backoff: not even tried
    assert tier.get("a") is None and tier.stats.errors["throttled"] == 2
    assert time.perf_counter() - start_s < 1.0         # no hanging on a dead server
    assert tier.contains("a")                          # may still be there when it returns

    for expected_backoff_s in (0.2, 0.3, 0.3):         # doubles per failure, capped
        clock.now_s += 1.0
        assert tier.put("b", frame(1)) is False
        assert tier._backoff_s == pytest.approx(expected_backoff_s)
    assert tier.stats.errors["connection"] == 4

    redis_server.start()                               # same port, empty (no persistence)
    assert tier.get("a") is None and tier.stats.errors["throttled"] == 3
    clock.now_s += 1.0
    assert tier.get("a") is None and tier.stats.errors["lost"] == 1  # reconnected; gone
    assert not tier.contains("a")
    assert tier.put("c", frame(2)) and tier.get("c") == frame(2)
    assert tier._backoff_s == 0.0
    tier.check_integrity()
    tier.close()


@pytest.mark.redis
def test_redis_throttle_expires_in_real_time(redis_server):
    tier = redis_tier(redis_server, backoff_initial_s=0.05)
    redis_server.kill()
    assert tier.put("a", frame(0)) is False
    redis_server.start()
    assert tier.put("a", frame(0)) is False and tier.stats.errors["throttled"] == 1
    time.sleep(0.06)
    assert tier.put("a", frame(0)) and tier.get("a") == frame(0)
    tier.close()


@pytest.mark.redis
def test_redis_paused_server_times_out(redis_server):
    tier = redis_tier(redis_server, socket_timeout_s=0.1)
    assert tier.put("a", frame(0))
    redis_server.pause()
    try:
        start_s = time.perf_counter()
        assert tier.get("a") is None
        assert 0.05 < time.perf_counter() - start_s < 1.0
        assert tier.stats.errors["timeout"] == 1
    finally:
        redis_server.resume()
    time.sleep(tier._backoff_s)
    assert tier.get("a") == frame(0)
    tier.close()


@pytest.mark.redis
def test_redis_maxmemory_oom_fails_puts_without_marking_the_server_down(redis_server):
    tier = redis_tier(redis_server)
    used = tier.client.info("memory")["used_memory"]
    tier.client.config_set("maxmemory", used + 200_000)
    try:
        results = [tier.put(f"b{i}", frame(i)) for i in range(20)]
        assert results[0] and not all(results)
        assert tier.stats.errors["oom"] == results.count(False)
        assert tier._unavailable() is None and tier.get("b0") == frame(0)
        assert tier.stats.errors.keys() == {"oom"}
    finally:
        tier.client.config_set("maxmemory", 0)
    tier.close()


@pytest.mark.redis
def test_redis_keys_lost_by_the_server_are_counted(redis_server):
    tier = redis_tier(redis_server)
    tier.put("a", frame(0))
    tier.client.flushall()
    assert tier.get("a") is None and tier.stats.errors["lost"] == 1 and tier.used_bytes == 0
    tier.close()
