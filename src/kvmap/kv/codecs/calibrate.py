"""Static KV quantization ranges: compute them from samples, write and read the file.

The file holds, per layer, the calibrated per-channel range of K and of V:

    layers[i]["k.lo"], ["k.hi"], ["v.lo"], ["v.hi"]      each (num_kv_heads, head_dim)

One file serves every granularity: a codec with ``scale=static(path=FILE)`` reduces the
per-channel range to its own granularity (channel: as is; head: over head_dim; tensor:
over heads too) and to its symmetry (absmax = max(|lo|, |hi|)).

Formats, by suffix: ``.safetensors`` (tensors ``layers.{i}.k.lo`` ...) or JSON
(``{"format": "kvmap.kv-ranges", "version": 1, "layers": [{"k.lo": [[...]], ...}]}``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

FORMAT, VERSION = "kvmap.kv-ranges", 1
KEYS = ("k.lo", "k.hi", "v.lo", "v.hi")
Ranges = list[dict[str, torch.Tensor]]


def compute_ranges(samples: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   clip: float = 0.0) -> Ranges:
    """Per-layer per-channel ranges from ``samples[i] = (k, v)``, each (T, H, D) for layer
    i. ``clip`` drops that fraction of each tail (a quantile range) so that a few outlier
    tokens do not set the scale; 0 gives the plain min and max. Pure: returns float32
    tensors of shape (H, D)."""
    if not 0.0 <= clip < 0.5:
        raise ValueError(f"clip={clip!r} must be in [0, 0.5)")
    out: Ranges = []
    for layer, (k, v) in enumerate(samples):
        entry = {}
        for name, x in (("k", k), ("v", v)):
            if x.dim() != 3 or x.shape[0] == 0:
                raise ValueError(f"layer {layer} {name} samples have shape {tuple(x.shape)}; "
                                 "expected (T, num_kv_heads, head_dim) with T > 0")
            x = x.float()
            if clip:
                flat = x.flatten(1)                                        # (T, H*D)
                q = torch.tensor([clip, 1 - clip], device=x.device)
                lo, hi = torch.quantile(flat, q, dim=0).view(2, *x.shape[1:])
            else:
                lo, hi = x.amin(0), x.amax(0)                             # (H, D)
            entry[f"{name}.lo"], entry[f"{name}.hi"] = lo.cpu(), hi.cpu()
        out.append(entry)
    return out


def save_ranges(path: str | Path, ranges: Ranges) -> Path:
    """Write ``ranges`` to ``path`` (.safetensors or JSON); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file
        tensors = {f"layers.{i}.{key}": layer[key].contiguous()
                   for i, layer in enumerate(ranges) for key in KEYS}
        save_file(tensors, str(path), metadata={"format": FORMAT, "version": str(VERSION)})
    else:
        layers = [{key: layer[key].tolist() for key in KEYS} for layer in ranges]
        path.write_text(json.dumps({"format": FORMAT, "version": VERSION,
                                    "num_layers": len(layers), "layers": layers}))
    return path


def check_ranges(ranges: Ranges, source: str) -> Ranges:
    """``ranges`` if every bound is finite, ``lo <= hi`` everywhere and each layer's four
    tensors share one shape; else ValueError naming the layer and the key (a NaN bound
    would give NaN K/V silently)."""
    if not ranges:
        raise ValueError(f"static scale file {source!r} holds no layers")
    for i, layer in enumerate(ranges):
        shapes = {tuple(layer[key].shape) for key in KEYS}
        if len(shapes) != 1:
            raise ValueError(f"static scale file {source!r}: layer {i} has tensors of "
                             f"shapes {sorted(shapes)}; k.lo, k.hi, v.lo, v.hi must agree")
        for key in KEYS:
            if not bool(torch.isfinite(layer[key]).all()):
                raise ValueError(f"static scale file {source!r}: layer {i} {key} holds "
                                 "NaN or infinite values")
        for name in ("k", "v"):
            bad = int((layer[f"{name}.lo"] > layer[f"{name}.hi"]).sum())
            if bad:
                raise ValueError(f"static scale file {source!r}: layer {i} {name}: "
                                 f"{bad} channel(s) have lo > hi")
    return ranges


def load_ranges(path: str | Path) -> Ranges:
    """Read a file written by :func:`save_ranges`, checked by :func:`check_ranges`;
    ValueError naming the path if it is missing, not a ranges file, or holds bad bounds."""
    return check_ranges(_read_ranges(Path(path)), str(path))


def _read_ranges(path: Path) -> Ranges:
    if not path.is_file():
        raise ValueError(f"static scale file {str(path)!r} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            tensors = load_file(str(path))
            num_layers = len({name.split(".")[1] for name in tensors})
            return [{key: tensors[f"layers.{i}.{key}"].float() for key in KEYS}
                    for i in range(num_layers)]
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, not {FORMAT!r}")
        return [{key: torch.tensor(layer[key], dtype=torch.float32) for key in KEYS}
                for layer in doc["layers"]]
    except Exception as e:   # json, safetensors and shape errors alike
        raise ValueError(f"static scale file {str(path)!r} is not a KV ranges file: {e}"
                         ) from None


def calibrate(samples: Sequence[tuple[torch.Tensor, torch.Tensor]], path: str | Path,
              clip: float = 0.0) -> Path:
    """Compute the static ranges of ``samples`` (see :func:`compute_ranges`) and write
    them to ``path``. The ``kvmap calibrate`` command wraps this."""
    return save_ranges(path, compute_ranges(samples, clip))
