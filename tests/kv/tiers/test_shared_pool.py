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

KEY_ENV, KEY = "KVMAP_TEST_SHARED_KEY", "5e" * 32       # a random key of 32 bytes, hex
OTHER_KEY = "a7" * 32
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


def test_a_missing_short_or_passphrase_key_names_its_variable(monkeypatch):
    """The key is random (32+ bytes as hex), never a passphrase: one hash of a
    passphrase would let whoever reads the Redis test guesses offline against any
    sealed frame."""
    from kvmap.kv.tiers.shared_namespace import shared_keys
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=f"{KEY_ENV}.*is not set"):
        shared_keys(f"env:{KEY_ENV}")
    for bad in ("ab" * 31, "a passphrase of the test pool, long enough"):
        monkeypatch.setenv(KEY_ENV, bad)
        with pytest.raises(ValueError, match="random key of at least 32 bytes") as err:
            shared_keys(f"env:{KEY_ENV}")
        assert bad not in str(err.value) and "token_hex" in str(err.value)
    monkeypatch.setenv(KEY_ENV, KEY)
    keys = shared_keys(f"env:{KEY_ENV}")
    assert len({keys.frames, keys.index, keys.names}) == 3      # three derived keys
    assert all(len(k) == 32 for k in (keys.frames, keys.index, keys.names))


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


def put_all(tier, items) -> None:
    """Puts that are in Redis when this returns (the writes run on a thread)."""
    for key, data in items:
        assert tier.put(key, data)
    tier.flush()


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
    put_all(writer, [(b"h1", frame(1)), (b"h2", frame(2))])
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
    put_all(writer, [(b"h1", frame(1))])
    reader.discover([b"h1"])
    assert not reader.contains(b"h1") and reader.stats.errors["layout"] == 1
    assert reader.get(b"h1") is None
    # a key holder's index entry that lies about the layout: the frame, sealed by a key
    # holder with its own layout, still refuses it
    import redis
    from kvmap.kv.tiers.shared_frames import index_entry, seal
    client = redis.Redis.from_url(redis_url)
    client.set(reader._ikey(b"h2"), index_entry(reader._index_auth, b"b:h2", other,
                                                len(frame(2))))
    client.set(reader._rkey(b"h2"), seal(writer._seal_auth, b"b:h2", fingerprint, frame(2)))
    reader.discover([b"h2"])
    assert reader.get(b"h2") is None and reader.stats.errors["layout"] == 2
    assert not reader.contains(b"h2")
    reader.check_integrity()


@pytest.mark.redis
def test_names_are_keyed_and_another_key_sees_nothing(redis_url, fingerprint, monkeypatch):
    """A block's Redis names are a keyed hash of its prefix hash: neither the hash nor
    anything computable without the key appears in Redis, and a tier with another key
    looks under other names (it finds nothing, and touches nothing)."""
    import redis
    client = redis.Redis.from_url(redis_url)
    writer = shared_tier(redis_url, fingerprint)
    block_hash = bytes(range(32))
    put_all(writer, [(block_hash, frame(1))])
    names = [k for k in client.keys(namespace_prefix(fingerprint).encode() + b"*")]
    assert len(names) == 2 and not any(block_hash.hex().encode() in n or block_hash in n
                                       for n in names)
    monkeypatch.setenv("KVMAP_TEST_OTHER_KEY", OTHER_KEY)
    wrong = shared_tier(redis_url, fingerprint, "KVMAP_TEST_OTHER_KEY")
    assert wrong._rkey(block_hash) != writer._rkey(block_hash)
    wrong.discover([block_hash])
    assert not wrong.contains(block_hash) and wrong.stats.num_errors == 0
    assert client.exists(writer._rkey(block_hash))


@pytest.mark.redis
def test_garbage_under_our_names_is_counted_and_replaced(redis_url, fingerprint):
    """What a writer without the key can do: overwrite a name (it can read the names,
    not make new ones). A tampered frame, a forged index entry and a garbage entry are
    counted misses -- never refused forever -- and the next put of the block replaces
    them, so the pool serves it again."""
    import redis
    client = redis.Redis.from_url(redis_url)
    writer = shared_tier(redis_url, fingerprint)
    put_all(writer, [(b"h1", frame(1)), (b"h2", frame(2)), (b"h3", frame(3))])
    sealed = bytearray(client.get(writer._rkey(b"h2")))
    sealed[-1] ^= 0x01                                    # one flipped bit in the frame
    client.set(writer._rkey(b"h2"), bytes(sealed))
    entry = bytearray(client.get(writer._ikey(b"h3")))
    entry[40] ^= 0xFF                                     # a forged size in the entry
    client.set(writer._ikey(b"h3"), bytes(entry))
    client.set(writer._ikey(b"h1"), b"garbage")
    reader = shared_tier(redis_url, fingerprint)
    reader.discover([b"h1", b"h2", b"h3"])
    assert not reader.contains(b"h1") and not reader.contains(b"h3")
    assert reader.stats.errors["corrupt"] == 1 and reader.stats.errors["auth"] == 1
    assert reader.get(b"h2") is None and reader.stats.errors["auth"] == 2
    reader.discover([b"h1", b"h2", b"h3"])                # not fetched again meanwhile
    assert reader.stats.errors["auth"] == 2 and not reader.contains(b"h2")
    put_all(reader, [(b"h1", frame(1)), (b"h2", frame(2)), (b"h3", frame(3))])
    fresh = shared_tier(redis_url, fingerprint)
    fresh.discover([b"h1", b"h2", b"h3"])
    assert [fresh.get(k) for k in (b"h1", b"h2", b"h3")] == [frame(1), frame(2), frame(3)]
    assert fresh.stats.num_errors == 0
    reader.check_integrity()


@pytest.mark.redis
def test_a_forged_header_is_replaced_not_refused(redis_url, fingerprint):
    """A writer without the key rewrites a frame's header to claim another layout (the
    frame and its tag kept), and overwrites another with garbage as long as a header:
    the tag is checked first, so both are ``auth`` misses -- never ``layout``, never
    refused for ever -- and the next put replaces them (issue 38)."""
    import redis
    client = redis.Redis.from_url(redis_url)
    writer = shared_tier(redis_url, fingerprint)
    put_all(writer, [(b"h1", frame(1)), (b"h2", frame(2))])
    sealed = client.get(writer._rkey(b"h1"))
    client.set(writer._rkey(b"h1"), sealed[:8] + os.urandom(32) + sealed[40:], keepttl=True)
    client.set(writer._rkey(b"h2"), os.urandom(len(sealed)), keepttl=True)
    reader = shared_tier(redis_url, fingerprint)
    reader.discover([b"h1", b"h2"])
    assert reader.get(b"h1") is None and reader.get(b"h2") is None
    assert reader.stats.errors["auth"] == 2 and reader.stats.errors["layout"] == 0
    assert not reader._refused
    put_all(reader, [(b"h1", frame(1)), (b"h2", frame(2))])
    fresh = shared_tier(redis_url, fingerprint)
    fresh.discover([b"h1", b"h2"])
    assert [fresh.get(b"h1"), fresh.get(b"h2")] == [frame(1), frame(2)]
    assert fresh.stats.num_errors == 0


def test_the_tag_is_checked_before_the_header_is_believed():
    from kvmap.kv.tiers.auth import FrameAuth
    from kvmap.kv.tiers.base import TierError
    from kvmap.kv.tiers.shared_frames import SEAL_HEADER_BYTES, open_sealed, seal
    auth, fp = FrameAuth(os.urandom(32)), os.urandom(32)
    sealed = seal(auth, b"b:h", fp, frame(1))
    assert open_sealed(auth, b"b:h", fp, sealed) == frame(1)
    forged = [sealed[:8] + os.urandom(32) + sealed[40:],        # another fingerprint
              b"XXXX" + sealed[4:],                              # another magic
              sealed[:4] + b"\x09\x00" + sealed[6:],             # another version
              os.urandom(len(sealed))]                           # garbage
    for data in forged:
        with pytest.raises(TierError) as info:
            open_sealed(auth, b"b:h", fp, data)
        assert info.value.kind == "auth"
    with pytest.raises(TierError) as info:                       # too short for a tag
        open_sealed(auth, b"b:h", fp, sealed[:SEAL_HEADER_BYTES - 1])
    assert info.value.kind == "corrupt"
    with pytest.raises(TierError) as info:                       # a key holder's layout
        open_sealed(auth, b"b:h", os.urandom(32), sealed)
    assert info.value.kind == "layout"


@pytest.mark.redis
def test_a_full_local_view_forgets_blocks_but_redis_keeps_them(redis_url, fingerprint):
    import redis
    from kvmap.kv.tiers.shared_redis import SharedRedisTier
    client = redis.Redis.from_url(redis_url)
    writer = shared_tier(redis_url, fingerprint)
    keys = [f"h{i}".encode() for i in range(5)]
    put_all(writer, [(key, frame(i)) for i, key in enumerate(keys)])
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
    (wrong_key,) = run_peer([run], redis_url, key=OTHER_KEY)
    assert wrong_key["fetched_tokens"] == 0 and wrong_key["redis_hits"] == 0
    assert wrong_key["tokens"] == cold["tokens"]          # other names: it finds nothing
