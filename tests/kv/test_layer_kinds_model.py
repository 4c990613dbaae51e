"""The layer-kind model of the KV (``kvmap.kv.layer_kinds``): what each kind holds and
reads per layer and sequence."""
from __future__ import annotations

import pytest

from kvmap.kv.layer_kinds import (LAYER_KINDS, ChunkedLocal, GlobalAttention, KVLayout,
                                  LinearState, MLALatent, SharedKV, SlidingWindow)
from kvmap.model.shapes import get_shape


def test_every_kind_is_registered_once():
    assert sorted(LAYER_KINDS) == ["chunked", "global", "linear", "mla", "shared", "sliding"]


def test_resident_and_read_tokens_per_kind():
    g, s = GlobalAttention((0,), 8, 128), SlidingWindow((1,), 8, 128, 512)
    c = ChunkedLocal((2,), 8, 128, 8192)
    assert g.resident_tokens(10_000) == g.decode_read_tokens(10_000) == 10_000
    assert s.resident_tokens(10_000) == s.decode_read_tokens(10_000) == 512
    assert s.resident_tokens(300) == 300
    assert c.resident_tokens(10_000) == 8192                 # its peak
    assert c.decode_read_tokens(10_000) == 10_000 - 8192     # inside the second chunk
    assert c.decode_read_tokens(8192) == 8192


def test_mla_is_one_latent_per_token():
    k = MLALatent((0, 1), kv_lora_rank=512, rope_dim=64)
    geom = k.pool_geometry(16)
    assert geom.values_per_token == 576 and k.paged
    with pytest.raises(ValueError, match="must be even"):
        MLALatent((0,), 511, 64)


def test_linear_state_and_shared_layers_hold_no_tokens():
    lin, shared = LinearState((0,), state_values=1000), SharedKV((1,))
    assert lin.pool_geometry(16) is None and not lin.paged
    assert lin.resident_tokens(10**6) == 0 and lin.state_values_per_seq() == 1000
    assert shared.pool_geometry(16) is None and shared.decode_read_tokens(10**6) == 0
    layout = KVLayout((lin, shared), 2)
    assert layout.state_bytes_per_seq() == 2000               # bf16 state
    with pytest.raises(ValueError, match="positive"):
        LinearState((0,), 0)


def test_a_layout_covers_every_layer_exactly_once():
    with pytest.raises(ValueError, match="do not cover layers 0..2"):
        KVLayout((GlobalAttention((0, 1), 1, 8),), 3)
    layout = KVLayout.of_config(get_shape("gemma3-270m"))
    assert layout.names == ("global", "sliding")
    assert layout.kind("global").layers == (5, 11, 17)
    assert layout.kind("sliding").window_tokens() == 512
    assert KVLayout.of_config(get_shape("llama-3-8b")).names == ("global",)
