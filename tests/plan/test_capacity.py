"""The capacity planner against hand-computed figures and against the engine's own pool."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from kvmap.kv.cache import PagedKVCache, num_blocks_for_budget
from kvmap.kv.codecs import CODECS
from kvmap.kv.config import KVConfig
from kvmap.kv.spec import KVGeometry
from kvmap.model.dummy import dummy_weights
from kvmap.model.shapes import get_shape, with_layers
from kvmap.plan import capacity
from kvmap.plan.catalogue import PlanModel, get_gpu, get_model
from kvmap.plan.command import register
from kvmap.plan.planner import plan_capacity
from kvmap.perf.weights import num_params, weight_bytes

GiB = 2**30


def plan(model, kv="bf16", gpu="h100-80gb", **kwargs):
    return plan_capacity(get_model(model) if isinstance(model, str) else model,
                         get_gpu(gpu), kv, **kwargs)


# ---- hand-computed figures for real configs ---------------------------------------------
@pytest.mark.parametrize("model, kv, bytes_per_token", [
    ("llama-2-13b", "bf16", 2 * 40 * 40 * 128 * 2),             # 819,200 = 800 KiB
    ("llama-3-8b", "bf16", 2 * 32 * 8 * 128 * 2),               # 131,072
    ("qwen2.5-72b", "bf16", 2 * 80 * 8 * 128 * 2),              # 327,680
    ("llama-3-8b", "fp32", 2 * 32 * 8 * 128 * 4),
    # int8 per token: 1-byte codes plus one fp16 scale per token per KV head, K and V.
    ("llama-3-8b", "int8", 32 * 2 * 8 * (128 + 2)),             # 66,560
    # fp8: 1-byte codes plus one fp16 scale per token (all heads), K and V.
    ("qwen2.5-72b", "fp8", 80 * 2 * (8 * 128 + 2)),             # 164,160
    # int4, groups of 32: 64 code bytes + 4 fp16 scales + 4 fp16 zeros per head, K and V.
    ("llama-2-13b", "int4", 40 * 2 * 40 * (64 + 4 * 2 + 4 * 2)),
])
def test_kv_bytes_per_token_hand_computed(model, kv, bytes_per_token):
    if kv not in CODECS:
        pytest.skip(f"codec {kv} not registered")
    assert plan(model, kv, context_tokens=4096).kv_bytes_per_token == bytes_per_token


def test_llama_2_13b_is_800_kib_per_token_not_one_layer():
    p = plan("llama-2-13b", context_tokens=4096)
    assert p.kv_bytes_per_token == 800 * 1024
    assert p.kv_bytes_per_seq == 4096 * 800 * 1024          # 3.125 GiB, 256 whole blocks
    one_layer = 2 * 40 * 128 * 2                            # the formula that forgets layers
    assert p.kv_bytes_per_token == 40 * one_layer


def test_llama_3_8b_on_one_h100_hand_computed():
    """docs/planning.md's worked example, line by line."""
    p = plan("llama-3-8b", context_tokens=8192, concurrency=8)
    assert p.memory_bytes_per_gpu == 81559 * 2**20 == 85_520_809_984
    assert num_params(get_model("llama-3-8b")) == 8_030_261_248   # the published count
    assert p.weight_bytes == 16_060_522_496
    assert p.usable_kv_bytes_per_gpu == 76_968_728_985 - 16_060_522_496 - 2 * GiB
    assert p.kv_bytes_per_block_per_gpu == 2_097_152
    assert p.num_blocks_per_gpu == 28_019
    assert p.blocks_per_seq == 512
    assert p.max_concurrent_seqs == 54
    assert p.max_context_tokens == 3502 * 16 == 56_032


def test_tensor_parallel_splits_kv_heads_and_weights():
    p = plan("llama-3-70b", num_gpus=4, context_tokens=32768)
    assert p.num_kv_heads_per_gpu == 2
    assert p.kv_bytes_per_block_per_gpu == 16 * 327_680 // 4
    assert p.kv_bytes_per_seq == 32768 * 327_680
    assert p.weight_bytes_per_gpu == -(-p.weight_bytes // 4)
    # 8 KV heads over 16 GPUs: one head per GPU, each replicated twice.
    assert capacity.kv_heads_per_gpu(8, 64, 16) == 1
    with pytest.raises(ValueError, match="num_gpus=3"):
        plan("llama-3-8b", num_gpus=3)


def test_weight_formats_and_moe():
    llama = get_model("llama-3-8b")
    assert weight_bytes(llama, "bf16") == 2 * num_params(llama)
    assert weight_bytes(llama, "int4") < weight_bytes(llama, "int8") < weight_bytes(llama, "bf16")
    mixtral = get_model("Mixtral-8x7B")
    assert round(num_params(mixtral) / 1e9, 1) == 46.7        # all 8 experts
    assert plan(mixtral).kv_bytes_per_token == plan("mistral-7b-v0.3").kv_bytes_per_token
    with pytest.raises(ValueError, match="weights='int3'"):
        weight_bytes(llama, "int3")


# ---- residency: sliding window and policy budgets ---------------------------------------
def test_sliding_window_caps_resident_blocks():
    p = plan("mistral-7b", context_tokens=32768, concurrency=4)
    assert p.resident_tokens_per_seq == 4096
    assert p.blocks_per_seq == 4096 // 16 + 1                # one block partly slid out
    assert p.max_context_tokens is None                      # no context is too long
    assert any("sliding" in note for note in p.notes)
    assert plan("mistral-7b", context_tokens=4096).blocks_per_seq == 256


def policy(spec: str):
    return KVConfig.parse(spec).policy


@pytest.mark.parametrize("spec, context, kept, blocks", [
    ("streaming_llm(sinks=4,window=1024)", 8192, 1028, 65 + 1),
    ("streaming_llm(budget=0.25)", 8192, 2048, 128 + 1),
    ("window(size=1024)", 8192, 1024, 64 + 1),
    ("window(size=1024)", 1000, 1000, 63),                   # shorter than the window
    ("snapkv(budget=0.25)", 8192, 2048, 128 + 1),
    ("h2o(budget=512)", 8192, 512, 32 + 1),
    ("h2o(budget=512)", 100, 100, 7),                        # short sequence: untouched
    ("tova(budget=0.1)", 8192, 820, 52 + 1),
    ("knorm(budget=100)", 8192, 100, 7 + 1),
    ("random(budget=0.5)", 8192, 4096, 256 + 1),
    ("full", 8192, 8192, 512),
])
def test_policy_budgets(spec, context, kept, blocks):
    assert capacity.resident_tokens_per_seq(context, policy(spec)) == kept
    assert capacity.resident_blocks(context, 16, policy(spec)) == blocks


def test_streaming_llm_planned_at_sinks_plus_window():
    """The bug this replaced: validate() sets budget=1, which attribute probing read as
    one resident token."""
    p = plan("llama-3-8b", "streaming_llm(sinks=4,window=1024)", context_tokens=8192)
    assert p.resident_tokens_per_seq == 1028 and p.blocks_per_seq == 65 + 1
    assert p.max_context_tokens is None


def test_per_layer_budgets_size_the_largest_layer():
    pyramid = policy("snapkv(budget=40,layer_budgets=pyramid)")
    per_layer = pyramid.layer_resident_tokens(8192, 30)
    assert sum(per_layer) == 30 * 40 and max(per_layer) == 78
    assert capacity.resident_tokens_per_seq(8192, pyramid, num_layers=30) == 78
    with pytest.raises(ValueError, match="num_layers"):
        capacity.resident_tokens_per_seq(8192, pyramid)
    listed = policy("h2o(budget=64,layer_budgets=0.5/100)")
    assert listed.layer_resident_tokens(1000, 2) == [500, 100]
    assert capacity.resident_tokens_per_seq(1000, listed) == 500


def test_decode_time_budget_is_a_fraction_of_the_prompt():
    quarter = policy("snapkv(budget=0.25)")
    assert quarter.resident_tokens(1200, num_prompt_tokens=1000) == 250
    assert capacity.resident_tokens_per_seq(1200, quarter, num_prompt_tokens=1000) == 250


def test_plan_with_policy_and_fraction_budget():
    p = plan("llama-3-8b", "window(size=1024)", context_tokens=8192)
    assert p.resident_tokens_per_seq == 1024
    assert p.blocks_per_seq == 65 and p.max_context_tokens is None
    q = plan("llama-3-8b", "snapkv(budget=0.25)", context_tokens=8192, concurrency=8)
    # 3,502 blocks per sequence = ceil(c / 4 / 16) + 1 -> c / 4 <= 3,501 x 16 tokens.
    assert q.max_context_tokens == 4 * 3501 * 16
    with pytest.raises(ValueError, match="context_tokens=-1"):
        policy("h2o(budget=8)").resident_tokens(-1)


# ---- agreement with the engine's allocation ---------------------------------------------
ENGINE_SHAPES = [with_layers(get_shape("llama-3-8b"), 1), with_layers(get_shape("qwen2.5-7b"), 2),
                 get_shape("tiny")]
ENGINE_SPECS = [s for s in ("bf16", "fp16", "fp32", "fp8", "int8", "int4(group_size=16)",
                          "int2(group_size=16)", "kivi(group_size=16,staging_seqs=1)")
                if s.split("(")[0] in CODECS]


@pytest.mark.parametrize("spec", ENGINE_SPECS)
@pytest.mark.parametrize("config", ENGINE_SHAPES, ids=lambda c: c.name)
def test_agrees_with_engine_pool(config, spec):
    kv = KVConfig.parse(spec)
    geom = KVGeometry.of(config, 16)
    engine = PagedKVCache(kv.codec, geom, 4, "cpu", torch.bfloat16)
    p = plan(PlanModel(config), kv, context_tokens=100)
    assert p.kv_bytes_per_block_per_gpu == engine.bytes_per_block
    assert p.kv_bytes_per_token == engine.bytes_per_block / 16

    # A budget of 40.5 blocks: the engine's pool and the planner count the same blocks, and
    # the pool holds exactly max_concurrent_seqs sequences of 100 tokens (7 blocks each).
    # KIVI's staging pool (kv/codecs/staging.py: 8 rows here) is paid first.
    staging = kv.codec.staging_bytes(geom, 40)
    budget = engine.bytes_per_block * 81 // 2 + staging
    num_blocks = num_blocks_for_budget(kv.codec, geom, budget, torch.bfloat16)
    assert capacity.num_blocks_in(budget - staging, p.kv_bytes_per_block_per_gpu) \
        == num_blocks == 40
    assert kv.codec.num_blocks_in(budget, geom) == num_blocks
    pool = PagedKVCache(kv.codec, geom, num_blocks, "cpu", torch.bfloat16).pool
    num_seqs = 0
    while pool.num_free >= p.blocks_per_seq:
        pool.allocate(p.blocks_per_seq)
        num_seqs += 1
    assert num_seqs == num_blocks // p.blocks_per_seq == 5


def test_agrees_with_llm_engine_pool_and_dummy_weights():
    from kvmap import LLM
    config = get_shape("tiny")
    p = plan(PlanModel(config), "int8" if "int8" in CODECS else "bf16")
    budget = 50 * p.kv_bytes_per_block_per_gpu + 7
    llm = LLM(model="dummy:tiny", dtype="bf16", kv=p.kv_spec, kv_memory=budget, block_size=16,
              device="cpu")
    assert llm.engine.kv.pool.num_blocks == capacity.num_blocks_in(
        budget, p.kv_bytes_per_block_per_gpu) == 50
    for variant in (config, dataclasses.replace(config, attention_bias=True,
                                                tie_word_embeddings=True)):
        weights = dummy_weights(variant, torch.bfloat16)
        allocated = sum(t.numel() * t.element_size() for t in weights.values())
        assert weight_bytes(PlanModel(variant), "bf16") == allocated


# ---- model and GPU lookup, config.json ---------------------------------------------------
def test_lookup_is_case_insensitive_with_errors_listing_names():
    assert get_gpu("H100-80GB").name == "h100-80gb"
    assert get_model("Qwen2.5-72B").name == "qwen2.5-72b"
    with pytest.raises(ValueError, match="valid GPUs: .*rtx4090"):
        get_gpu("tpu-v5")
    with pytest.raises(ValueError, match="valid models: .*mixtral-8x7b"):
        get_model("gpt-5")


def test_config_json_matches_catalogue(tmp_path):
    hf = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
          "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert plan(str(tmp_path)).kv_bytes_per_token == plan("llama-3-8b").kv_bytes_per_token
    mixtral = {**hf, "architectures": ["MixtralForCausalLM"], "vocab_size": 32000,
               "num_local_experts": 8, "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(mixtral))
    assert get_model(str(tmp_path / "config.json")).num_experts == 8


# ---- the CLI -----------------------------------------------------------------------------
@pytest.fixture
def cli():
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)          # two commands: `plan` stays a subcommand
    return lambda *args: CliRunner().invoke(app, ["plan", *args])


def test_cli_json(cli):
    result = cli("--model", "llama-3-70b", "--gpu", "h100-80gb", "--num-gpus", "4",
                 "--context", "32768", "--kv", "bf16", "--kv", "int8", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["gpu"]["name"] == "h100-80gb" and out["num_gpus"] == 4
    bf16, int8 = out["plans"]
    assert bf16["kv_bytes_per_token"] == 327_680
    assert int8["max_concurrent_seqs"] > bf16["max_concurrent_seqs"]


def test_cli_table(cli):
    result = cli("--model", "llama-2-13b", "--gpu", "a100-80gb", "--context", "4096",
                 "--kv", "bf16")
    assert result.exit_code == 0, result.output
    assert "819,200" in result.output


@pytest.mark.parametrize("args, named", [
    (["--model", "llama-3-8b", "--gpu", "tpu-v5"], "tpu-v5"),
    (["--model", "gpt-5", "--gpu", "h200"], "gpt-5"),
    (["--model", "llama-3-8b", "--gpu", "h200", "--kv", "int9"], "int9"),
    (["--model", "llama-3-8b", "--gpu", "h200", "--weights", "int3"], "int3"),
    (["--model", "llama-3-8b", "--gpu", "h200", "--context", "0"], "context=0"),
    (["--model", "llama-3-8b", "--gpu", "h200", "--reserve", "lots"], "lots"),
])
def test_cli_bad_values_exit_2_naming_them(cli, args, named):
    result = cli(*args)
    assert result.exit_code == 2
    assert named in result.output
    if "tpu-v5" in args:
        assert "a100-80gb" in result.output and "rtx4090" in result.output
