"""Corrupted, truncated, replayed and forged frames on disk and in Redis, through the
engine: every tampered read is detected (a counted miss, never a wrong block), and the
greedy tokens equal a run without tiers."""
from __future__ import annotations

import struct
import zlib

import pytest

from kvmap.kv.tiers import serde
from tests.conftest import make_tiny_llm
from tests.kv.tiers.test_store import NUM_BLOCKS, run_conversations

TAMPERS = ["flip", "truncate", "replay", "forge"]


@pytest.fixture(scope="module")
def no_tier_answers():
    return run_conversations(make_tiny_llm(kv="fp32+recompute", num_blocks=NUM_BLOCKS))


def forged(frame: bytes) -> bytes:
    """The same frame with one payload byte changed and its CRC recomputed: what someone
    who can write the store and knows the format would send."""
    buf = bytearray(frame)
    buf[-1] ^= 0x01
    crc = zlib.crc32(bytes(buf[serde.HEADER_BYTES:]), zlib.crc32(bytes(buf[:24])))
    struct.pack_into("<I", buf, 24, crc)
    return bytes(buf)


def tamper_all(values: dict, how: str) -> dict:
    """key -> new bytes for every stored value (``values``: key -> bytes)."""
    keys = sorted(values)
    if how == "flip":
        return {k: v[:len(v) // 2] + bytes([v[len(v) // 2] ^ 0x40]) + v[len(v) // 2 + 1:]
                for k, v in values.items()}
    if how == "truncate":
        return {k: v[:len(v) // 3] for k, v in values.items()}
    if how == "replay":        # each key gets another key's valid frame
        return {k: values[keys[(i + 1) % len(keys)]] for i, k in enumerate(keys)}
    return {k: forged(v) for k, v in values.items()}


class Watch:
    """Tamper with every value a tier holds, then watch its reads: each tampered key read
    again must be refused (counted ``corrupt`` or ``auth``), none served."""

    def __init__(self, tier, how: str, read_raw, write_raw) -> None:
        self.tier, self.how = tier, how
        self.read_raw, self.write_raw = read_raw, write_raw
        self.tampered: dict = {}
        self.num_read_again = 0
        self.num_served = 0
        self.errors_before = 0

    def tamper(self) -> None:
        values = {k: self.read_raw(k) for k in self.tier.keys()}
        self.tampered = tamper_all(values, self.how)
        for key, data in self.tampered.items():
            self.write_raw(key, data)
        self.errors_before = self._detected()
        read, get = self.tier._read, self.tier.get

        def watched_read(key):
            if key in self.tampered:
                self.num_read_again += 1
            return read(key)

        def watched_get(key):
            data = get(key)
            if data is not None and key in self.tampered and data == self.tampered[key]:
                self.num_served += 1
            if data is None:         # refused and dropped: a later put is honest again
                self.tampered.pop(key, None)
            return data
        self.tier._read, self.tier.get = watched_read, watched_get

    def _detected(self) -> int:
        e = self.tier.stats.errors
        return e.get("corrupt", 0) + e.get("auth", 0)

    def check(self, answers, no_tier_answers) -> None:
        assert answers == no_tier_answers
        assert self.num_read_again > 0, "no tampered frame was read again"
        assert self.num_served == 0
        assert self._detected() - self.errors_before == self.num_read_again   # 100%


def make_watch(where: str, how: str, request):
    """An engine over a disk or a Redis tier, and a Watch of that tier."""
    if where == "disk":
        spec = f"disk=1MiB,disk_path={request.getfixturevalue('tmp_path')}"
    else:
        spec = f"redis={request.getfixturevalue('redis_server').url}"
    llm = make_tiny_llm(kv=f"fp32+tiers({spec},fetch=always)", num_blocks=NUM_BLOCKS)
    request.addfinalizer(llm.engine.close)
    t = llm.engine.offload.levels[0].tier
    if where == "disk":
        return llm, Watch(t, how, lambda k: t.path_of(k).read_bytes(),
                          lambda k, d: t.path_of(k).write_bytes(d))
    return llm, Watch(t, how, lambda k: t.client.get(t._rkey(k)),
                      lambda k, d: t.client.set(t._rkey(k), d))


@pytest.mark.parametrize("how", TAMPERS)
@pytest.mark.parametrize("where", ["disk", pytest.param("redis", marks=pytest.mark.redis)])
def test_tampered_frames_are_detected(where, how, request, no_tier_answers):
    llm, watch = make_watch(where, how, request)

    def between(turn, conversation):
        if (turn, conversation) == (1, 0):
            watch.tamper()
    watch.check(run_conversations(llm, between), no_tier_answers)
    llm.engine.check_integrity()
