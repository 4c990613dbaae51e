"""Read a Hugging Face model directory: ``config.json`` + ``*.safetensors`` (+ ``tokenizer.json``).

Supported architectures: ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``.
Weights keep their Hugging Face names (those of ``shapes.weight_shapes``); a sharded
checkpoint is read through ``model.safetensors.index.json``, a single one from its file.
Both the transformers 4 (``rope_theta``, ``rope_scaling``) and 5 (``rope_parameters``) ways
of writing RoPE settings are understood.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from kvmap.config import ModelConfig
from kvmap.model.shapes import check_weights
from kvmap.model.tokenizer import Tokenizer

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_INDEX_FILE = "model.safetensors.index.json"


@dataclass
class HFModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None


def is_hf_dir(path: str | Path) -> bool:
    """True when ``path`` is a directory with a ``config.json``."""
    return (Path(path) / "config.json").is_file()


def config_from_hf(hf_config: dict[str, Any], name: str) -> ModelConfig:
    """The ``ModelConfig`` of a HF ``config.json`` dict; ValueError for other architectures."""
    archs = hf_config.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"architectures={archs!r} of {name!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    hidden, num_heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
    rope = dict(hf_config.get("rope_parameters") or {})          # transformers 5
    rope_theta = hf_config.get("rope_theta", rope.pop("rope_theta", 10000.0))
    rope_scaling = hf_config.get("rope_scaling") or rope or None
    if rope_scaling is not None:
        rope_scaling = dict(rope_scaling)
        rope_scaling.setdefault("rope_type", rope_scaling.pop("type", "default"))
        if rope_scaling["rope_type"] == "default":
            rope_scaling = None
    if arch == "Qwen2ForCausalLM":
        window = hf_config.get("sliding_window") if hf_config.get("use_sliding_window") else None
    else:
        window = hf_config.get("sliding_window")
    eos = hf_config.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return ModelConfig(
        name=name,
        num_layers=hf_config["num_hidden_layers"],
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
        head_dim=hf_config.get("head_dim") or hidden // num_heads,
        intermediate_size=hf_config["intermediate_size"],
        vocab_size=hf_config["vocab_size"],
        rope_theta=float(rope_theta),
        rms_norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=hf_config.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        attention_bias=arch == "Qwen2ForCausalLM" or bool(hf_config.get("attention_bias")),
        sliding_window=window,
        rope_scaling=rope_scaling,
        bos_token_id=hf_config.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def safetensors_files(path: Path) -> list[Path]:
    """The checkpoint's shard files: from the index when there is one, else ``*.safetensors``."""
    index = path / _INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {str(path)!r}")
    return files


def load_hf_weights(path: Path, config: ModelConfig, dtype: torch.dtype,
                    device: torch.device | str) -> dict[str, torch.Tensor]:
    """All weights of the checkpoint in ``dtype`` on ``device``, one tensor at a time.

    Buffers that are not weights (``rotary_emb.inv_freq``) are skipped, and a tied model's
    ``lm_head.weight`` is dropped (it is ``model.embed_tokens.weight``).
    """
    weights = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as shard:
            for name in shard.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                if name == "lm_head.weight" and config.tie_word_embeddings:
                    continue
                weights[name] = shard.get_tensor(name).to(dtype=dtype).to(device)
    check_weights(config, weights)
    return weights


def load_hf_dir(path: str | Path, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> HFModel:
    """Config, weights and (when ``tokenizer.json`` exists) tokenizer of a HF directory."""
    path = Path(path)
    if not is_hf_dir(path):
        raise ValueError(f"{str(path)!r} is not a Hugging Face model directory (no config.json)")
    config = config_from_hf(json.loads((path / "config.json").read_text()), path.name)
    tokenizer = (Tokenizer.from_hf_dir(path, eos_token_ids=config.eos_token_ids)
                 if (path / "tokenizer.json").is_file() else None)
    return HFModel(config=config, weights=load_hf_weights(path, config, dtype, device),
                   tokenizer=tokenizer)
