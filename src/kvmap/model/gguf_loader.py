"""Read a llama.cpp GGUF file: its shape, its dequantized weights in Hugging Face names.

``load_gguf(path, dtype, device)`` returns a ``GGUFModel``: the ``ModelConfig`` from the
``llama.*`` metadata, the weights (every type ``gguf.quants.dequantize`` knows: F32, F16,
BF16, Q4_0, Q4_1, Q8_0, the K-quants, ...) and the raw metadata, from which
``Tokenizer.from_gguf_metadata`` builds the tokenizer.

llama.cpp's converter reorders the rows of ``attn_q`` and ``attn_k`` for its interleaved
rotary layout; ``unpermute_rotary_rows`` undoes that so the weights equal Hugging Face's
(as transformers' own GGUF loader does). ``general.architecture`` ``llama`` (SmolLM,
Llama 1/2/3, Mistral all ship as ``llama``) and ``gemma3`` are read
(``SUPPORTED_ARCHITECTURES``); anything else is a ValueError naming it and them, raised
from the metadata before any weight is read. A Gemma 3 file's rotary rows are in HF's
order already, and its norm weights are stored as ``1 + w``: they come back as HF's
``w``; what a Gemma 3 GGUF leaves out of its metadata is llama.cpp's rule for the
architecture (``gemma3_config.py``).

``read_int4_groups(path, config)`` reads the layer matrices stored as Q4_0 / Q4_1 as
the engine's int4 groups (``wquant.Int4Groups``) straight from their blocks, with no
trip through a dense dtype: ``LLM(quantization="int4")`` on a GGUF builds those
matrices from them (``linear.int4_layer``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvmap.config import ModelConfig
from kvmap.model.gemma3_config import gemma3_fields
from kvmap.model.shapes import check_weights
from kvmap.model.wquant import INT4_GROUP_SIZE, Int4Groups, int4_from_affine_blocks

SUPPORTED_ARCHITECTURES = ("llama", "gemma3")

# GGUF tensor name -> Hugging Face name; "{i}" is the layer index.
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
# Gemma 3: a norm after attention and after the MLP, the FFN norm before it, q/k norms
_GEMMA3_LAYER_NAMES = {**_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                       "post_attention_norm": "post_attention_layernorm",
                       "post_ffw_norm": "post_feedforward_layernorm",
                       "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_ARCH_LAYER_NAMES = {"llama": _LAYER_NAMES, "gemma3": _GEMMA3_LAYER_NAMES}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_ROPE_FREQS = "rope_freqs.weight"      # llama.cpp's form of Llama-3.1 RoPE scaling


@dataclass
class GGUFModel:
    """What a GGUF file holds: shape, HF-named weights, and the metadata as Python values."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    metadata: dict[str, Any]


def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` on ``path`` (memory-mapped); ValueError naming a bad path."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GGUF file {str(path)!r} does not exist")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError) as err:
        raise ValueError(f"{str(path)!r} is not a readable GGUF file: {err}") from err


def read_metadata(reader) -> dict[str, Any]:
    """Every metadata field as a Python value (arrays as lists), header fields excluded."""
    return {key: field.contents() for key, field in reader.fields.items()
            if not key.startswith("GGUF.")}


def _f32(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def config_from_metadata(metadata: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]],
                         name: str, rope_freqs: np.ndarray | None = None) -> ModelConfig:
    """The ``ModelConfig`` a llama GGUF describes.

    ``tensor_shapes`` (GGUF name -> numpy-order shape) settles what the metadata may leave
    out: tied embeddings (no ``output.weight``), q/k/v biases, the vocabulary size.
    """
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} of {name!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def meta(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF {name!r} lacks metadata key {arch}.{key!r}")
        return value

    hidden, num_heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // num_heads))
    rope_theta = _f32(meta("rope.freq_base", 10000.0))
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab_size = len(tokens) if tokens else tensor_shapes["token_embd.weight"][0]
    eos_ids = [metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    extra = gemma3_fields(metadata, tensor_shapes, name) if arch == "gemma3" else {}
    return ModelConfig(
        name=name,
        num_layers=int(meta("block_count")),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=int(meta("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        intermediate_size=int(meta("feed_forward_length")),
        vocab_size=int(vocab_size),
        rope_theta=rope_theta,
        rms_norm_eps=_f32(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(meta("context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensor_shapes,
        attention_bias="blk.0.attn_q.bias" in tensor_shapes,
        rope_scaling=_rope_scaling(metadata, arch, rope_freqs, rope_theta, head_dim),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(dict.fromkeys(int(i) for i in eos_ids if i is not None)),
        architecture=arch,
        **extra,
    )


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32,
              device: torch.device | str = "cpu") -> GGUFModel:
    """Read ``path``: config, weights dequantized to ``dtype`` on ``device``, metadata.

    One tensor at a time is dequantized (to float32 numpy), un-permuted, cast and moved, so
    the extra memory at any moment is a few float32 copies of one tensor, never the model.
    """
    from gguf import quants

    reader = open_gguf(path)
    metadata = read_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    shapes = {n: tuple(int(s) for s in reversed(t.shape)) for n, t in tensors.items()}
    rope_freqs = (quants.dequantize(tensors[_ROPE_FREQS].data, tensors[_ROPE_FREQS].tensor_type)
                  if _ROPE_FREQS in tensors else None)
    config = config_from_metadata(metadata, shapes, Path(path).stem, rope_freqs)

    weights = {}
    arch = config.architecture
    for gguf_name, tensor in tensors.items():
        if gguf_name == _ROPE_FREQS:
            continue
        hf_name = hf_tensor_name(gguf_name, arch)
        array = quants.dequantize(tensor.data, tensor.tensor_type).reshape(shapes[gguf_name])
        if not array.flags.writeable:          # a view of the read-only memory map
            array = array.copy()
        weight = torch.from_numpy(array)
        if arch == "gemma3" and gguf_name.endswith("norm.weight"):
            weight = weight - 1.0              # the file holds 1 + w (llama.cpp's converter)
        elif arch == "llama" and ".attn_q." in gguf_name:
            weight = unpermute_rotary_rows(weight, config.num_heads)
        elif arch == "llama" and ".attn_k." in gguf_name:
            weight = unpermute_rotary_rows(weight, config.num_kv_heads)
        weights[hf_name] = weight.to(dtype=dtype).to(device)
    check_weights(config, weights)
    return GGUFModel(config=config, weights=weights, metadata=metadata)


def read_int4_groups(path: str | Path, config: ModelConfig) -> dict[str, Int4Groups]:
    """HF name -> ``Int4Groups`` for every layer matrix of ``path`` stored as Q4_0 or
    Q4_1 (other types are absent: they take the dense path). q/k rows un-permuted as in
    :func:`load_gguf`; codes, scales and zeros as :func:`wquant.int4_from_affine_blocks`."""
    from gguf import GGMLQuantizationType as T

    groups = {}
    for tensor in open_gguf(path).tensors:
        if tensor.tensor_type not in (T.Q4_0, T.Q4_1) or not tensor.name.startswith("blk."):
            continue
        rows, cols = (int(s) for s in reversed(tensor.shape))
        if cols % INT4_GROUP_SIZE:
            continue
        g = q4_blocks_to_groups(np.asarray(tensor.data), rows, cols,
                                tensor.tensor_type == T.Q4_1)
        if ".attn_q." in tensor.name or ".attn_k." in tensor.name:
            heads = config.num_heads if ".attn_q." in tensor.name else config.num_kv_heads
            g = Int4Groups(*(unpermute_rotary_rows(t, heads) for t in (g.codes, g.scale,
                                                                        g.zero)))
        groups[hf_tensor_name(tensor.name)] = g
    return groups


def q4_blocks_to_groups(raw: np.ndarray, rows: int, cols: int, has_min: bool) -> Int4Groups:
    """One Q4_0 / Q4_1 tensor's bytes (rows, blocks x block bytes) -> ``Int4Groups``.

    A block of 32 weights: fp16 d, (Q4_1 only) fp16 m, then 16 bytes whose low nibbles
    are weights 0..15 and high nibbles weights 16..31 (ggml's layout); w = d * q + m,
    Q4_0's w = d * (q - 8) being m = -8 d."""
    num_blocks = cols // INT4_GROUP_SIZE
    head = 4 if has_min else 2
    blocks = raw.reshape(rows, num_blocks, head + INT4_GROUP_SIZE // 2)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
    m = (torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]) if has_min
         else -8 * d.float())
    packed = torch.from_numpy(blocks[..., head:].copy())          # (rows, G, 16) uint8
    codes = torch.cat([packed & 0x0F, packed >> 4], -1).reshape(rows, cols)
    return int4_from_affine_blocks(d, m, codes)


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``.

    ValueError names a tensor with no Hugging Face equivalent in ``arch``.
    """
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _ARCH_LAYER_NAMES[arch]
    m = _LAYER_RE.fullmatch(gguf_name)
    if not m or m.group(2) not in names:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face {arch} equivalent")
    layer, part, kind = m.groups()
    return f"model.layers.{layer}.{names[part]}.{kind}"


def unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row order of a q/k projection (or bias) so it equals Hugging Face's.

    Per head of ``head_dim = d`` rows, HF keeps the two rotary halves apart (rotate_half);
    llama.cpp interleaves them::

        HF    [a0 a1 ... a(d/2-1) | b0 b1 ... b(d/2-1)]
        GGUF  [a0 b0 a1 b1 ... a(d/2-1) b(d/2-1)]

    ``weight``: (num_heads * d, ...) in GGUF order -> same shape in HF order.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise ValueError(f"{rows} rows do not split into {num_heads} heads of even size")
    half = rows // num_heads // 2
    return (weight.reshape(num_heads, half, 2, *weight.shape[1:])
            .transpose(1, 2).reshape(weight.shape))


def permute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """HF row order -> llama.cpp's (the inverse of ``unpermute_rotary_rows``)."""
    half = weight.shape[0] // num_heads // 2
    return (weight.reshape(num_heads, 2, half, *weight.shape[1:])
            .transpose(1, 2).reshape(weight.shape))


def _rope_scaling(metadata: dict[str, Any], arch: str, rope_freqs: np.ndarray | None,
                  rope_theta: float, head_dim: int) -> dict | None:
    """RoPE scaling as a HF ``rope_scaling`` dict, or None when positions are not scaled."""
    kind = metadata.get(f"{arch}.rope.scaling.type")
    if rope_freqs is not None:
        return llama3_rope_scaling_from_factors(
            rope_freqs, rope_theta, head_dim,
            int(metadata.get(f"{arch}.rope.scaling.original_context_length", 8192)))
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(metadata[f"{arch}.rope.scaling.factor"])}
    raise ValueError(f"GGUF {arch}.rope.scaling.type={kind!r} is not supported")


def llama3_rope_factors(rope_theta: float, head_dim: int, factor: float,
                        original_context: int, low_freq_factor: float = 1.0,
                        high_freq_factor: float = 4.0) -> np.ndarray:
    """Per-frequency divisors of Llama-3.1 RoPE scaling, (head_dim // 2,) float32.

    Wavelengths shorter than ``original_context / high_freq_factor`` keep their frequency,
    longer than ``original_context / low_freq_factor`` are slowed by ``factor``, and the
    band between is interpolated (Meta's ``apply_scaling``; llama.cpp's ``rope_freqs``).
    """
    inv_freq = 1.0 / rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = ((original_context / wavelen - low_freq_factor)
              / (high_freq_factor - low_freq_factor))
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < original_context / high_freq_factor, 1.0,
                   np.where(wavelen > original_context / low_freq_factor, factor, mid))
    return out.astype(np.float32)


def llama3_rope_scaling_from_factors(rope_freqs: np.ndarray, rope_theta: float, head_dim: int,
                                     original_context: int = 8192) -> dict:
    """Recover the ``rope_scaling`` dict from a ``rope_freqs`` tensor (default band 1..4)."""
    factor = float(np.max(rope_freqs))
    expected = llama3_rope_factors(rope_theta, head_dim, factor, original_context)
    if expected.shape != rope_freqs.shape or not np.allclose(expected, rope_freqs, rtol=1e-4):
        raise ValueError("rope_freqs.weight is not a Llama-3 RoPE scaling with "
                         f"original_context={original_context} and frequency band 1..4")
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": original_context}
