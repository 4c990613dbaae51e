"""Random weights for a catalogued shape: ``dummy:llama-3-8b``, ``dummy:llama-3-8b?layers=2``
or ``dummy:llama-3-8b?layers=4&vocab=4096`` (a cut vocabulary keeps the output head from
hiding the attention's share of the time and memory).

Dummy models measure memory and speed at a real model's geometry without its weights;
their outputs mean nothing. Contract of ``dummy_weights``:

- every weight of ``shapes.weight_shapes(config)``, in Hugging Face names;
- matrices and biases ~ N(0, 0.02) rows; norm weights exactly 1;
- identical for the same ``(config, seed)`` on every device and dtype-rounded alike, and a
  layer's weights do not depend on how many layers the model has;
- made directly in the target dtype on the target device, one tensor at a time, with no
  full-size float32 temporary.

Why a pool: drawing one normal number per weight runs single-threaded at ~5 ns each (16 s
for an 8B model's embeddings and head). Instead one pool of N(0, 0.02) numbers is drawn
once, and each row of a matrix is a window of the pool at its own random offset::

    pool   [p0 p1 p2 p3 p4 p5 p6 ... p(P + cols - 1)]
    row r  = pool[offset_r : offset_r + cols]        offset_r ~ U[0, P)

so a matrix is one ``index_select`` on an overlapping strided view: memory speed.
"""
from __future__ import annotations

import zlib

import torch

from kvmap.config import ModelConfig
from kvmap.model.shapes import get_shape, weight_shapes, with_layers, with_vocab

DUMMY_PREFIX = "dummy:"
WEIGHT_STD = 0.02
_POOL_SIZE = 1 << 20          # distinct row offsets; rows repeat a window of this pool


def parse_dummy_spec(spec: str, num_layers: int | None = None) -> ModelConfig:
    """``"dummy:<shape>[?layers=N][&vocab=V]"`` (prefix optional) -> the shape, with
    ``num_layers`` applied.

    A ``num_layers`` argument overrides the one in the string.
    """
    body = spec[len(DUMMY_PREFIX):] if spec.lower().startswith(DUMMY_PREFIX) else spec
    name, _, query = body.partition("?")
    config = get_shape(name)
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key not in ("layers", "vocab") or not value.isdigit() or int(value) < 1:
            raise ValueError(f"dummy model option {item!r} in {spec!r} is not "
                             "'layers=<int>' or 'vocab=<int>'")
        config = with_layers(config, int(value)) if key == "layers" else \
            with_vocab(config, int(value))
    if num_layers is not None:
        config = with_layers(config, num_layers)
    return config


def dummy_weights(config: ModelConfig, dtype: torch.dtype = torch.bfloat16,
                  device: torch.device | str = "cpu", seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights for ``config`` in Hugging Face names (see the module docstring)."""
    shapes = weight_shapes(config)
    max_cols = max(shape[-1] for shape in shapes.values())
    gen = torch.Generator().manual_seed(seed)
    # Drawn on the CPU, then moved: the same numbers on every device.
    pool = torch.empty(_POOL_SIZE + max_cols).normal_(0.0, WEIGHT_STD, generator=gen)
    pool = pool.to(dtype=dtype, device=device)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, dtype=dtype, device=device)
        else:
            weights[name] = _pool_rows(pool, shape, seed, name)
    return weights


def _pool_rows(pool: torch.Tensor, shape: tuple[int, ...], seed: int, name: str) -> torch.Tensor:
    """A tensor of ``shape`` whose rows are windows of ``pool`` at offsets seeded by ``name``."""
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    offsets = torch.randint(0, _POOL_SIZE, (rows,), generator=gen).to(pool.device)
    windows = pool.as_strided((_POOL_SIZE, cols), (1, 1))   # row i = pool[i : i + cols]
    return torch.index_select(windows, 0, offsets).reshape(shape)


def load_dummy(spec: str, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
               num_layers: int | None = None,
               seed: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Parse ``spec`` and make its weights: ``(config, weights)``."""
    config = parse_dummy_spec(spec, num_layers)
    return config, dummy_weights(config, dtype, device, seed)
