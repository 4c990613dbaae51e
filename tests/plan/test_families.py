"""``kvmap plan`` on the published configs of each family (``fixtures/hf``), one row per
family checked against a hand computation at 32,768 tokens in bf16, block size 16.

Per layer and token a K+V layer holds 2 x kv_heads x head_dim x 2 bytes; a sliding layer
of window W at 32,768 tokens holds the blocks from its first live slot on,
2048 - (32768 - W + 1) // 16 blocks (W=512: 32, W=1024: 64, W=128: 8, chunk 8192: 512);
an MLA layer one latent of kv_lora_rank + qk_rope_head_dim values; a gated DeltaNet layer
a fixed state of v_heads x k_dim x v_dim + (conv kernel - 1) x (2 x k_heads x k_dim +
v_heads x v_dim) values."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvmap.plan.catalogue import get_gpu, get_model
from kvmap.plan.planner import plan_capacity
from kvmap.perf.weights import num_params

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
CTX = 32768
KIB = 1024

# model: {kind: (layers, kv_bytes_per_seq by hand)}, published parameter count (billions)
ROWS = {
    "gemma-3-1b-it": ({"global": (4, 4 * CTX * 2 * 1 * 256 * 2),
                       "sliding": (22, 22 * 32 * 16 * 2 * 1 * 256 * 2)}, 1.0),
    "gemma-3-4b-it": ({"global": (5, 5 * CTX * 2 * 4 * 256 * 2),
                       "sliding": (29, 29 * 64 * 16 * 2 * 4 * 256 * 2)}, 3.9),
    "gemma-3-27b-it": ({"global": (10, 10 * CTX * 2 * 16 * 128 * 2),
                        "sliding": (52, 52 * 64 * 16 * 2 * 16 * 128 * 2)}, 27.0),
    "gpt-oss-20b": ({"global": (12, 12 * CTX * 2 * 8 * 64 * 2),
                     "sliding": (12, 12 * 8 * 16 * 2 * 8 * 64 * 2)}, 20.9),
    "gpt-oss-120b": ({"global": (18, 18 * CTX * 2 * 8 * 64 * 2),
                      "sliding": (18, 18 * 8 * 16 * 2 * 8 * 64 * 2)}, 116.8),
    "qwen3-8b": ({"global": (36, 36 * CTX * 2 * 8 * 128 * 2)}, 8.2),
    "qwen3-32b": ({"global": (64, 64 * CTX * 2 * 8 * 128 * 2)}, 32.8),
    "qwen3-30b-a3b": ({"global": (48, 48 * CTX * 2 * 4 * 128 * 2)}, 30.5),
    "qwen3-next-80b-a3b-instruct": ({"global": (12, 12 * CTX * 2 * 2 * 256 * 2),
                                     "linear": (36, 36 * (32 * 128 * 128 + 3 * 8192) * 2)},
                                    80.0),
    "deepseek-v3": ({"mla": (61, 61 * CTX * (512 + 64) * 2)}, 671.0),
    "llama-4-scout-17b-16e-instruct": ({"global": (12, 12 * CTX * 2 * 8 * 128 * 2),
                                        "chunked": (36, 36 * 512 * 16 * 2 * 8 * 128 * 2)},
                                       107.8),     # 109B with the vision tower
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_family_row_matches_the_hand_computation(name):
    kinds, params_b = ROWS[name]
    model = get_model(str(FIXTURES / name))
    plan = plan_capacity(model, get_gpu("h200"), "bf16", context_tokens=CTX)
    assert set(plan.layer_kinds) == set(kinds)
    for kind, (num_layers, seq_bytes) in kinds.items():
        got = plan.layer_kinds[kind]
        assert got["num_layers"] == num_layers, kind
        assert got["kv_bytes_per_seq"] == seq_bytes, kind
    # the kinds add up to what the pool holds per sequence
    assert plan.kv_bytes_per_seq == sum(seq for _, seq in kinds.values())
    assert num_params(model) / 1e9 == pytest.approx(params_b, rel=0.02)


def test_concurrency_at_a_context_is_the_pool_over_the_sequence():
    model = get_model(str(FIXTURES / "qwen3-8b"))
    plan = plan_capacity(model, get_gpu("h100-80gb"), "bf16", context_tokens=CTX)
    usable = int(81559 * 2**20 * 0.9) - plan.weight_bytes - 2 * 2**30
    assert plan.max_concurrent_seqs == usable // (36 * 16 * 4 * KIB) // (CTX // 16) == 12


def test_linear_state_counts_per_sequence_beside_the_blocks():
    model = get_model(str(FIXTURES / "qwen3-next-80b-a3b-instruct"))
    plan = plan_capacity(model, get_gpu("h200"), "bf16", context_tokens=CTX, weights="fp8")
    state = 36 * (32 * 128 * 128 + 3 * 8192) * 2
    assert plan.state_bytes_per_seq == state
    paged = 12 * CTX * 2 * 2 * 256 * 2
    assert plan.max_concurrent_seqs == plan.usable_kv_bytes_per_gpu // (paged + state)
    # int8 halves the paged layers, not the state
    int8 = plan_capacity(model, get_gpu("h200"), "int8", context_tokens=CTX, weights="fp8")
    assert int8.layer_kinds["linear"]["kv_bytes_per_seq"] == state
    assert int8.layer_kinds["global"]["kv_bytes_per_seq"] < paged * 0.51


def test_a_hybrid_model_is_far_below_its_all_global_size():
    """The saving a calculator that counts every layer as global misses."""
    plan = plan_capacity(get_model(str(FIXTURES / "gemma-3-27b-it")), get_gpu("h200"),
                         "bf16", context_tokens=CTX)
    all_global = plan.kv_bytes_per_token * CTX
    assert all_global / plan.kv_bytes_per_seq > 4.5


def test_max_context_is_bounded_by_the_model_and_says_so():
    """Gemma 3 270M's memory bound (millions of tokens) is not a context it can use."""
    plan = plan_capacity(get_model("gemma3-270m"), get_gpu("h100-80gb"), "bf16",
                         context_tokens=8192)
    assert plan.max_context_tokens > 700 * 32768
    assert plan.usable_max_context_tokens == plan.model_max_context_tokens == 32768
    assert any("beyond the model's own limit max_position_embeddings=32,768" in n
               for n in plan.notes)


def test_a_policy_on_a_sliding_layer_is_moot_and_on_mla_acts():
    gemma = get_model(str(FIXTURES / "gemma-3-27b-it"))
    full = plan_capacity(gemma, get_gpu("h200"), "bf16", context_tokens=CTX)
    kept = plan_capacity(gemma, get_gpu("h200"), "streaming_llm(budget=4096,sinks=4)",
                         context_tokens=CTX)
    assert kept.layer_kinds["sliding"]["kv_bytes_per_seq"] == \
        full.layer_kinds["sliding"]["kv_bytes_per_seq"]
    assert kept.layer_kinds["global"]["kv_bytes_per_seq"] < \
        full.layer_kinds["global"]["kv_bytes_per_seq"] / 7
    ds = get_model(str(FIXTURES / "deepseek-v3"))
    mla = plan_capacity(ds, get_gpu("h200"), "streaming_llm(budget=4096,sinks=4)",
                        context_tokens=CTX, num_gpus=8, weights="fp8")
    assert mla.layer_kinds["mla"]["resident_tokens_per_seq"] == 4096
    assert mla.num_kv_heads_per_gpu == 1          # the latent is replicated, not split


def test_a_config_missing_a_key_names_it(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["DeepseekV3ForCausalLM"], '
                                          '"num_hidden_layers": 2, "hidden_size": 8}')
    with pytest.raises(ValueError, match="DeepseekV3ForCausalLM config .* lacks the key"):
        get_model(str(tmp_path))


def test_all_global_is_the_layout_a_hybrid_saving_is_measured_against(tmp_path):
    gemma = get_model(str(FIXTURES / "gemma-3-27b-it"))
    hybrid = plan_capacity(gemma, get_gpu("h100-80gb"), "bf16", context_tokens=CTX)
    flat = plan_capacity(gemma.all_global(), get_gpu("h100-80gb"), "bf16", context_tokens=CTX)
    assert set(flat.layer_kinds) == {"global"}
    assert flat.kv_bytes_per_seq == 62 * CTX * 2 * 16 * 128 * 2        # 15.5 GiB
    assert (hybrid.max_concurrent_seqs, flat.max_concurrent_seqs) == (6, 1)
    # Llama 4's chunked layers become global too; Qwen3-Next's linear ones stay linear
    scout = get_model(str(FIXTURES / "llama-4-scout-17b-16e-instruct")).all_global()
    assert scout.layout.names == ("global",) and scout.config.sliding_layers is None
    nxt = get_model(str(FIXTURES / "qwen3-next-80b-a3b-instruct"))
    assert nxt.all_global() is nxt


def test_plan_command_prints_kinds_the_model_limit_and_all_global():
    from typer.testing import CliRunner
    import typer
    from kvmap.plan.command import register
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["plan", "--model", str(FIXTURES / "gemma-3-1b-it"),
                                      "--gpu", "h100-80gb", "--context", "32768",
                                      "--kv", "bf16", "--all-global"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "32,768 (model)" in out and "max_position_embeddings=32,768" in out
    assert "bf16 (all-global)" in out and "sliding" in out and "22,528" in out
