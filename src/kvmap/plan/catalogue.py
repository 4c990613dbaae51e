"""What the planner plans for: named GPUs and named (or user-supplied) model shapes.

GPU figures are the vendors' public spec sheets (SXM parts where there is a choice), dense
tensor-core throughput (not the 2:4-sparsity figure), except ``memory_bytes``: that is the
total the driver reports (``nvidia-smi --query-gpu=memory.total``, MiB), which is what
``gpu_memory_utilization`` multiplies in vLLM and here. It is a little below the marketing
size on most parts (L40S "48 GB" reports 46068 MiB = 45.0 GiB).

    gpu                 spec memory  reported MiB  HBM/GDDR B/s  bf16 FLOP/s  fp8 FLOP/s  link
    A100 SXM 40 GB      40 GB        40960         1.555e12      312e12       -           NVLink 600 GB/s
    A100 SXM 80 GB      80 GB        81920         2.039e12      312e12       -           NVLink 600 GB/s
    H100 SXM 80 GB      80 GB        81559         3.35e12       989e12       1979e12     NVLink 900 GB/s
    H200 SXM 141 GB     141 GB       143771        4.8e12        989e12       1979e12     NVLink 900 GB/s
    L40S                48 GB        46068         0.864e12      362e12       733e12      PCIe 4.0 64 GB/s
    RTX 4090            24 GB        24564         1.008e12      165e12       330e12      PCIe 4.0 64 GB/s

(RTX 4090 tensor figures are those with fp32 accumulate, from the Ada whitepaper.)

Models: every shape of :mod:`kvmap.model.shapes`, plus Mixtral 8x7B, a mixture of experts
whose attention -- and so whose KV cache -- is Mistral-7B's (32 layers, 8 KV heads of 128),
while its weights hold 8 expert MLPs per layer (2 active per token). A path to a Hugging
Face ``config.json`` (or to the directory holding one) works too.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvmap.config import ModelConfig
from kvmap.model.shapes import get_shape, shape_names
from kvmap.plan.plan_model import PlanModel

_MiB = 2**20


@dataclass(frozen=True)
class GPU:
    """One accelerator's memory size and speeds (per device)."""

    name: str
    description: str
    memory_bytes: int                  # total as the driver reports it
    memory_bandwidth_bytes_per_s: float
    bf16_flops: float                  # dense tensor-core FLOP/s
    fp8_flops: float | None            # None where the part has no fp8 tensor cores
    interconnect: str
    interconnect_bytes_per_s: float    # per direction per GPU

    def to_dict(self) -> dict:
        return dict(self.__dict__)


GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("a100-40gb", "NVIDIA A100 SXM 40 GB", 40960 * _MiB, 1.555e12, 312e12, None,
        "NVLink 3", 600e9),
    GPU("a100-80gb", "NVIDIA A100 SXM 80 GB", 81920 * _MiB, 2.039e12, 312e12, None,
        "NVLink 3", 600e9),
    GPU("h100-80gb", "NVIDIA H100 SXM 80 GB", 81559 * _MiB, 3.35e12, 989e12, 1979e12,
        "NVLink 4", 900e9),
    GPU("h200", "NVIDIA H200 SXM 141 GB", 143771 * _MiB, 4.8e12, 989e12, 1979e12,
        "NVLink 4", 900e9),
    GPU("l40s", "NVIDIA L40S 48 GB", 46068 * _MiB, 0.864e12, 362e12, 733e12,
        "PCIe 4.0 x16", 64e9),
    GPU("rtx4090", "NVIDIA GeForce RTX 4090 24 GB", 24564 * _MiB, 1.008e12, 165e12, 330e12,
        "PCIe 4.0 x16", 64e9),
)}
GPU_ALIASES = {"a100": "a100-80gb", "h100": "h100-80gb", "h200-141gb": "h200",
               "rtx-4090": "rtx4090", "4090": "rtx4090"}


def gpu_names() -> list[str]:
    return sorted([*GPUS, *GPU_ALIASES])


def get_gpu(name: str) -> GPU:
    """The catalogued GPU called ``name`` (case-insensitive); ValueError lists the names."""
    key = name.strip().lower()
    key = GPU_ALIASES.get(key, key)
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; valid GPUs: {', '.join(gpu_names())}")
    return GPUS[key]


_MIXTRAL_8X7B = ModelConfig(
    name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
    head_dim=128, intermediate_size=14336, vocab_size=32000, rope_theta=1e6,
    max_position_embeddings=32768, bos_token_id=1, eos_token_ids=(2,))
MOE_MODELS: dict[str, PlanModel] = {
    "mixtral-8x7b": PlanModel(_MIXTRAL_8X7B, num_experts=8, num_experts_per_tok=2)}


def model_names() -> list[str]:
    return sorted([*shape_names(), *MOE_MODELS])


def get_model(name_or_path: str) -> PlanModel:
    """A catalogued model (case-insensitive) or a HF ``config.json`` / model directory.

    ValueError lists the catalogued names when ``name_or_path`` is neither.
    """
    path = Path(name_or_path)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return model_from_config_json(path)
    key = name_or_path.strip().lower()
    if key in MOE_MODELS:
        return MOE_MODELS[key]
    try:
        return PlanModel(get_shape(key))
    except ValueError:
        raise ValueError(f"unknown model {name_or_path!r} (not a catalogued name nor a "
                         f"config.json path); valid models: {', '.join(model_names())}") from None


def model_from_config_json(path: str | Path) -> PlanModel:
    """Read a Hugging Face ``config.json``: Llama, Mistral, Qwen2, Mixtral, or a family of
    :mod:`kvmap.plan.hf_families` (Gemma 3, GPT-OSS, Qwen3, Qwen3-Next, DeepSeek V3,
    Llama 4)."""
    from kvmap.model.hf_loader import config_from_hf   # safetensors etc. only when used
    from kvmap.plan.hf_families import read_family
    path = Path(path)
    try:
        hf = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read model config {str(path)!r}: {e}") from None
    name = path.parent.name or path.stem
    family = read_family(hf, name)
    if family is not None:
        return family
    num_experts, per_tok = 1, 1
    if "MixtralForCausalLM" in (hf.get("architectures") or []):
        # Mixtral's attention and config keys are Mistral's; the experts are extra keys.
        num_experts, per_tok = hf["num_local_experts"], hf["num_experts_per_tok"]
        hf = {**hf, "architectures": ["MistralForCausalLM"]}
    try:
        config = config_from_hf(hf, name)
    except KeyError as e:
        raise ValueError(f"model config {str(path)!r} lacks the key {e.args[0]!r}") from None
    return PlanModel(config, num_experts, per_tok)
