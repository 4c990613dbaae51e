"""The shared pool under its threat model (``docs/threat_model.md``), through the engine:

- **poisoned**: a key holder seals frames whose K/V hold NaN -- every one is refused when
  it is decoded (``nonfinite``), the block is recomputed and its next publish replaces
  it (a reader finds the first bad block of a prompt, so a pool heals block by block);
- **garbage**: a Redis writer without the key overwrites every value under the pool's
  names (frames and index entries) -- counted misses, never served, and replaced by the
  next process that computes the blocks, so a third process reads them again;
- **forged**: a Redis writer without the key rewrites every frame's header to claim
  another layout (issue 38: checked before the tag, this made every reader refuse the
  block for its life) -- ``auth`` misses, never ``layout``, replaced like garbage;
- **paused**: the shared Redis is stopped (SIGSTOP) while a process reads and writes
  through it -- every request completes;
- **tenants**: requests with different ``cache_salt`` share no block.

Every case asserts greedy tokens equal to a run without tiers; none asserts timing
(``benchmarks/faults.py`` measures what the faults cost)."""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.tiers import serde
from kvmap.kv.tiers.base import key_bytes
from kvmap.kv.tiers.shared_frames import open_sealed, seal
from kvmap.kv.tiers.shared_namespace import namespace_prefix
from tests.conftest import make_tiny_llm, random_prompts

KEY_ENV, KEY = "KVMAP_TEST_SHARED_KEY", "3c" * 32
SPEC = (f"fp32+tiers(redis=env:KVMAP_TEST_SHARED_URL,shared=true,shared_key=env:{KEY_ENV},"
        f"fetch=always)")
PROMPTS = random_prompts([37, 29, 45], vocab=256, seed=23)
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)

pytestmark = pytest.mark.redis


@pytest.fixture
def shared(redis_server, monkeypatch):
    monkeypatch.setenv("KVMAP_TEST_SHARED_URL", redis_server.url)
    monkeypatch.setenv(KEY_ENV, KEY)
    return redis_server


@pytest.fixture(scope="module")
def reference():
    llm = make_tiny_llm()
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]


def run(prompts=PROMPTS):
    """A fresh process-like LLM on the shared pool: (tokens, its store, its shared tier,
    the content keys it knew before it closed)."""
    llm = make_tiny_llm(kv=SPEC)
    outs = llm.generate(prompts, PARAMS)
    store = llm.engine.offload.store
    tier = store.levels[-1].tier
    tier.flush()                                  # its writes are in Redis now
    llm.engine.check_integrity()
    known = [k for k in tier.keys() if isinstance(k, bytes)]
    llm.engine.close()
    return [o.token_ids for o in outs], store, tier, known


def shared_values(redis_server, tier, kind: bytes):
    import redis
    client = redis.Redis.from_url(redis_server.url)
    pattern = namespace_prefix(tier.fingerprint).encode() + kind + b":*"
    return client, list(client.scan_iter(match=pattern))


def poison(redis_server, writer, known: list[bytes]) -> int:
    """A key holder re-seals every frame of ``known`` with a NaN in each float tensor;
    the number of frames poisoned."""
    client, _ = shared_values(redis_server, writer, b"b")
    for key in known:
        name, kb = writer._rkey(key), key_bytes(key)
        frame = serde.decode_block(open_sealed(writer._seal_auth, kb, writer.fingerprint,
                                               client.get(name)))
        for layer in frame:
            for t in layer.values():
                if t.is_floating_point():
                    t.view(-1)[0] = float("nan")
        client.set(name, seal(writer._seal_auth, kb, writer.fingerprint,
                              serde.encode_block(frame)), keepttl=True)
    return len(known)


def garbage(redis_server, writer) -> int:
    """A writer without the key overwrites every value under the pool's names (it can
    list them, not make new ones); the number of values overwritten."""
    client, frames = shared_values(redis_server, writer, b"b")
    _, entries = shared_values(redis_server, writer, b"i")
    g = torch.Generator().manual_seed(5)
    for name in frames + entries:
        client.set(name, torch.randint(0, 256, (64,), generator=g, dtype=torch.uint8)
                   .numpy().tobytes(), keepttl=True)
    return len(frames) + len(entries)


def forge(redis_server, writer) -> int:
    """A writer without the key rewrites every frame's header fingerprint (another
    layout), keeping the frame and its tag; the number of frames forged."""
    client, frames = shared_values(redis_server, writer, b"b")
    g = torch.Generator().manual_seed(7)
    for name in frames:
        sealed = client.get(name)
        other = torch.randint(0, 256, (32,), generator=g, dtype=torch.uint8).numpy()
        client.set(name, sealed[:8] + other.tobytes() + sealed[40:], keepttl=True)
    return len(frames)


def test_frames_poisoned_by_a_key_holder_are_refused_and_replaced(shared, reference):
    tokens, _, writer, known = run()
    assert tokens == reference and known
    poison(shared, writer, known)
    tokens, store, tier, _ = run()
    assert tokens == reference
    assert store.stats.errors["nonfinite"] >= 1 and store.stats.num_fetched_tokens == 0
    first = store.stats.errors["nonfinite"]
    tokens, store, _, _ = run()         # the blocks the first reader recomputed replaced
    assert tokens == reference and store.stats.num_fetched_tokens > 0
    assert store.stats.errors["nonfinite"] <= first


def test_garbage_from_a_writer_without_the_key_is_never_served(shared, reference):
    tokens, _, writer, _ = run()
    assert garbage(shared, writer) > 0
    tokens, store, tier, _ = run()
    assert tokens == reference and store.stats.num_fetched_tokens == 0
    assert tier.stats.errors["corrupt"] >= 1 and tier.stats.hits == 0
    tokens, store, tier, _ = run()      # replaced by the reader that recomputed them
    assert tokens == reference and store.stats.num_fetched_tokens > 0
    assert tier.stats.num_errors == 0


def test_forged_headers_are_never_refused_for_ever(shared, reference):
    tokens, _, writer, _ = run()
    assert forge(shared, writer) > 0
    tokens, store, tier, _ = run()
    assert tokens == reference and store.stats.num_fetched_tokens == 0
    assert tier.stats.errors["auth"] >= 1 and tier.stats.errors["layout"] == 0
    # each reader replaces the first forged block of each prompt, which it recomputed
    # (index entries are intact, so it reads no further): the pool heals block by block
    first = tier.stats.errors["auth"]
    tokens, store, tier, _ = run()
    assert tokens == reference and tier.stats.errors["layout"] == 0
    assert store.stats.num_fetched_tokens > 0 and tier.stats.errors["auth"] <= first
    assert tier.stats.hits > 0


def test_a_paused_shared_redis_loses_no_request(shared, reference):
    run()                                           # the pool holds the prompts' blocks
    llm = make_tiny_llm(kv=SPEC)
    shared.pause()
    try:
        outs = llm.generate(PROMPTS, PARAMS)
    finally:
        shared.resume()
    assert [o.token_ids for o in outs] == reference
    tier = llm.engine.offload.store.levels[-1].tier
    assert tier.stats.errors["timeout"] >= 1
    llm.engine.check_integrity()
    llm.engine.close()
    tokens, store, _, _ = run()                     # and it serves again once resumed
    assert tokens == reference and store.stats.num_fetched_tokens > 0


def test_tenants_with_different_salts_share_no_block(shared, reference):
    llm = make_tiny_llm(kv=SPEC)
    engine = llm.engine
    for salt, expect_hit in (("tenant-a", False), ("tenant-a", True), ("tenant-b", False),
                             (None, False)):
        req = engine.add_request(PROMPTS[0], PARAMS, cache_salt=salt)
        while not req.status.finished:
            engine.step()
        engine.requests.pop(req.request_id)
        assert req.output_token_ids == reference[0]
        cached = req.metrics.num_cached_prompt_tokens
        assert (cached > 0) == expect_hit, (salt, cached)
    engine.close()
