"""The shared remote pool (``tiers(redis=URL, shared=true, shared_key=env:NAME)``):
spec checks, the namespace, sealed frames against a real Redis, and two (and more) real
kvmap processes reusing each other's prefix blocks.

Process tests run ``shared_peer.py`` in subprocesses against the session's redis-server
(``redis_url`` in conftest; skipped, with the reason, when there is none)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvmap.kv.codecs import CODECS
from kvmap.kv.config import KVConfig
from kvmap.kv.spec import KVGeometry
from kvmap.kv.tiers import serde
from kvmap.kv.tiers.shared_namespace import (
    layout_fingerprint, namespace_prefix, weights_identity)

KEY_ENV, KEY = "KVMAP_TEST_SHARED_KEY", "a passphrase of the test pool"
PEER = Path(__file__).with_name("shared_peer.py")
SRC = Path(__file__).resolve().parents[3] / "src"


# ---- spec-parse checks (no Redis) ---------------------------------------------------------
@pytest.mark.parametrize("tiers, message", [
    ("tiers(host=1MiB,shared=true,shared_key=env:K)", "shared=true is given without redis="),
    ("tiers(redis=redis://h:1/0,shared=true)", "shared=true needs shared_key=env:NAME"),
    ("tiers(redis=redis://h:1/0,shared_key=env:K)", "shared_key= is given without shared=true"),
    ("tiers(redis=redis://h:1/0,shared=true,shared_key=hunter2hunter2hunter2)",
     "shared_key must be env:NAME"),
    ("tiers(redis=redis://h:1/0,shared=maybe,shared_key=env:K)",
     "shared=maybe must be true or false"),
])
def test_bad_shared_specs_are_named_at_parse_time(tiers, message):
    with pytest.raises(ValueError, match=message) as err:
        KVConfig.parse("bf16+" + tiers)
    assert "hunter2" not in str(err.value)        # a literal key is never echoed


def test_a_missing_or_short_key_names_its_variable(monkeypatch):
    from kvmap.kv.tiers.shared_namespace import shared_auth_key
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=f"{KEY_ENV}.*is not set"):
        shared_auth_key(f"env:{KEY_ENV}")
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(ValueError, match="fewer than 16 characters") as err:
        shared_auth_key(f"env:{KEY_ENV}")
    assert "short" not in str(err.value)
    monkeypatch.setenv(KEY_ENV, KEY)
    assert len(shared_auth_key(f"env:{KEY_ENV}")) == 32


# ---- the namespace ------------------------------------------------------------------------
def test_the_namespace_changes_with_weights_codec_geometry_and_dtype():
    from kvmap.config import ModelConfig
    config = ModelConfig("m", 2, 64, 4, 2, 16, 128, 100)
    emb = torch.randn(100, 64)
    ident = weights_identity("m", config, None, [emb])
    assert ident == weights_identity("m", config, None, [emb.clone()])
    others = [weights_identity("m", config, None, [torch.randn(100, 64)]),   # another seed
              weights_identity("m", config, "int8", [emb]),                 # weight format
              weights_identity("m2", config, None, [emb])]
    assert ident not in others
    geom, bf16, int8 = KVGeometry(2, 2, 16, 4), CODECS["bf16"](), CODECS["int8"]()
    fp = layout_fingerprint(ident, geom, bf16, bf16, torch.float32)
    variants = [layout_fingerprint(others[0], geom, bf16, bf16, torch.float32),
                layout_fingerprint(ident, geom, int8, int8, torch.float32),
                layout_fingerprint(ident, geom, bf16, int8, torch.float32),
                layout_fingerprint(ident, KVGeometry(2, 2, 16, 8), bf16, bf16, torch.float32),
                layout_fingerprint(ident, geom, bf16, bf16, torch.bfloat16)]
    assert len({fp, *variants}) == 6
    assert len({namespace_prefix(f) for f in (fp, *variants)}) == 6
    assert namespace_prefix(fp) == f"kvmap:shared:{fp[:16].hex()}:"


# ---- sealed frames on a real Redis --------------------------------------------------------
def frame(seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return serde.encode_block([{"k": torch.randn(4, 2, 16, generator=g)}])


def shared_tier(url, fingerprint, key_env=KEY_ENV):
    from kvmap.kv.tiers.shared_redis import SharedRedisTier
    return SharedRedisTier(1 << 20, "lru", url=url, shared_key=f"env:{key_env}",
                           layout_fingerprint=fingerprint)


@pytest.fixture
def fingerprint(redis_url, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    fp = os.urandom(32)
    yield fp
    import redis
    from kvmap.kv.tiers.shared_redis import clear_namespace
    clear_namespace(redis.Redis.from_url(redis_url), fp)


@pytest.mark.redis
def test_a_peer_tier_finds_and_reads_what_another_wrote(redis_url, fingerprint):
    writer, reader = shared_tier(redis_url, fingerprint), shared_tier(redis_url, fingerprint)
    assert writer.put(b"h1", frame(1)) and writer.put(b"h2", frame(2))
    assert not reader.contains(b"h1")                     # nothing known before discovery
    reader.discover([b"h1", b"h2", b"h3"])
    assert reader.contains(b"h1") and reader.contains(b"h2") and not reader.contains(b"h3")
    assert reader.get(b"h1") == frame(1) and reader.get(b"h2") == frame(2)
    assert reader.stats.hits == 2 and reader.stats.num_errors == 0
    reader.check_integrity()
    writer.close()                                        # a shared close deletes nothing
    fresh = shared_tier(redis_url, fingerprint)
    fresh.discover([b"h1"])
    assert fresh.get(b"h1") == frame(1)


@pytest.mark.redis
def test_another_layout_in_the_same_namespace_is_a_counted_miss(redis_url, fingerprint):
    writer = shared_tier(redis_url, fingerprint)
    other = fingerprint[:16] + bytes(16)                  # same namespace, other layout
    assert namespace_prefix(other) == namespace_prefix(fingerprint)
    reader = shared_tier(redis_url, other)
    assert writer.put(b"h1", frame(1))
    reader.discover([b"h1"])
    assert not reader.contains(b"h1") and reader.stats.errors["layout"] == 1
    assert reader.get(b"h1") is None
    # an index entry that lies about the layout: the sealed frame still refuses it
    import redis
    from kvmap.kv.tiers.shared_frames import index_entry
    client = redis.Redis.from_url(redis_url)
    client.set(reader._ikey(b"h2"), index_entry(other, len(frame(2))))
    client.set(reader._rkey(b"h2"), client.get(writer._rkey(b"h1")))
    reader.discover([b"h2"])
    assert reader.get(b"h2") is None and reader.stats.errors["layout"] == 2
    assert not reader.contains(b"h2")
    reader.check_integrity()


@pytest.mark.redis
def test_a_tampered_frame_or_a_wrong_key_is_a_miss_and_deletes_nothing(
        redis_url, fingerprint, monkeypatch):
    import redis
    client = redis.Redis.from_url(redis_url)
    writer = shared_tier(redis_url, fingerprint)
    assert writer.put(b"h1", frame(1)) and writer.put(b"h2", frame(2))
    monkeypatch.setenv("KVMAP_TEST_OTHER_KEY", "another passphrase entirely")
    wrong = shared_tier(redis_url, fingerprint, "KVMAP_TEST_OTHER_KEY")
    wrong.discover([b"h1"])
    assert wrong.get(b"h1") is None and wrong.stats.errors["auth"] == 1
    assert client.exists(writer._rkey(b"h1"))             # a wrong key cannot wipe the pool
    sealed = bytearray(client.get(writer._rkey(b"h2")))
    sealed[-1] ^= 0x01                                    # one flipped bit in the frame
    client.set(writer._rkey(b"h2"), bytes(sealed))
    reader = shared_tier(redis_url, fingerprint)
    reader.discover([b"h1", b"h2"])
    assert reader.get(b"h2") is None and reader.stats.errors["auth"] == 1
    assert reader.get(b"h1") == frame(1)
    reader.discover([b"h2"])                              # refused once, not fetched again
    assert not reader.contains(b"h2")
    reader.check_integrity()


@pytest.mark.redis
def test_a_full_local_view_forgets_blocks_but_redis_keeps_them(redis_url, fingerprint):
    import redis
    from kvmap.kv.tiers.shared_redis import SharedRedisTier
    client = redis.Redis.from_url(redis_url)
    writer = shared_tier(redis_url, fingerprint)
    keys = [f"h{i}".encode() for i in range(5)]
    for i, key in enumerate(keys):
        assert writer.put(key, frame(i))
    small = SharedRedisTier(3 * len(frame(0)), "lru", url=redis_url,
                            shared_key=f"env:{KEY_ENV}", layout_fingerprint=fingerprint)
    small.discover(keys)
    assert len(small) == 3 and small.used_bytes <= small.capacity_bytes
    assert small.stats.evictions == 2
    small.check_integrity()
    assert all(client.exists(writer._rkey(k)) for k in keys)   # only the view forgot
    small.discover(keys[:1])                                   # and can learn it again
    assert small.get(keys[0]) == frame(0)


@pytest.mark.redis
def test_keys_that_are_not_content_hashes_stay_private(redis_url, fingerprint):
    """A pager's ``page/...`` key names one process's sequence: two processes that page
    must never read each other's pages, and a page is deleted when it is done."""
    import redis
    client = redis.Redis.from_url(redis_url)
    a, b = shared_tier(redis_url, fingerprint), shared_tier(redis_url, fingerprint)
    assert a.put("page/0/0/0", frame(1)) and b.put("page/0/0/0", frame(2))
    assert a.get("page/0/0/0") == frame(1) and b.get("page/0/0/0") == frame(2)
    assert a.put("page/0/0/0", frame(3)) and a.get("page/0/0/0") == frame(3)  # replaced
    rkey = a._rkey("page/0/0/0")
    assert not rkey.startswith(a.key_prefix) and client.exists(rkey)
    assert a.delete("page/0/0/0") and not client.exists(rkey)
    b.close()
    assert not client.exists(b._rkey("page/0/0/0"))


# ---- real processes -----------------------------------------------------------------------
def run_peer(runs: list[dict], redis_url: str, key: str = KEY) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "KVMAP_TEST_REDIS_URL": redis_url, KEY_ENV: key}
    proc = subprocess.run([sys.executable, str(PEER), json.dumps(runs)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shared_spec(codec: str = "fp32") -> str:
    return (f"{codec}+tiers(redis=env:KVMAP_TEST_REDIS_URL,shared=true,"
            f"shared_key=env:{KEY_ENV},fetch=always)")


@pytest.mark.redis
def test_a_second_process_reuses_the_first_ones_blocks_and_others_read_nothing(redis_url):
    g = torch.Generator().manual_seed(17)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (41, 29)]
    run = {"model": "dummy:tiny", "kv": shared_spec(), "prompts": prompts}
    (first,) = run_peer([run], redis_url)
    assert first["fetched_tokens"] == 0 and first["redis_hits"] == 0
    second, cold, int8, other_model = run_peer(
        [run, {**run, "kv": "fp32"}, {**run, "kv": shared_spec("int8")},
         {**run, "model": "dummy:tiny?layers=1"}], redis_url)
    # B: every full prompt block but the one holding the last token, from A's writes
    assert second["cached_tokens"] == [40, 28]
    assert second["fetched_tokens"] == 68 and second["redis_hits"] == 17
    assert second["namespace"] == first["namespace"] and not second["redis_errors"]
    assert second["tokens"] == cold["tokens"] == first["tokens"]
    for peer in (int8, other_model):                      # other codec / model: nothing
        assert peer["fetched_tokens"] == 0 and peer["redis_hits"] == 0
        assert peer["namespace"] != first["namespace"]
    (wrong_key,) = run_peer([run], redis_url, key="not the pool's passphrase")
    assert wrong_key["fetched_tokens"] == 0 and wrong_key["redis_hits"] == 0
    assert wrong_key["redis_errors"].get("auth", 0) >= 1
    assert wrong_key["tokens"] == cold["tokens"]
