"""On-disk cache of converted weights, so a GGUF is dequantized once, not at every start.

An entry is a directory ``<root>/<key>/`` holding

    model.safetensors      HF-named weights in the requested dtype (no pickle)
    config.json            the ModelConfig as JSON
    tokenizer.json         the tokenizer (when the model has one) ...
    tokenizer_meta.json    ... and its special ids and chat template

``root`` is ``$KVMAP_CACHE_DIR`` or ``~/.cache/kvmap/weights``. ``key`` is the sha256 of
(absolute source path, size in bytes, mtime in ns, dtype, ``LOADER_VERSION``): editing or
replacing the source, asking for another dtype, or changing the conversion code all miss.
An entry is written into a temporary directory and renamed into place, so a reader sees
a whole entry or none, even if two processes convert at once.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from kvmap.config import ModelConfig
from kvmap.model.tokenizer import Tokenizer

LOADER_VERSION = 1     # bump when conversion output changes, to invalidate old entries
_WEIGHTS, _CONFIG = "model.safetensors", "config.json"


def cache_root() -> Path:
    """``$KVMAP_CACHE_DIR`` if set, else ``~/.cache/kvmap/weights``."""
    env = os.environ.get("KVMAP_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kvmap" / "weights"


def cache_key(source: str | Path, dtype: torch.dtype) -> str:
    """sha256 hex of the source's identity (path, size, mtime) plus dtype and loader version."""
    path = Path(source).resolve()
    stat = path.stat()
    ident = json.dumps([str(path), stat.st_size, stat.st_mtime_ns, str(dtype), LOADER_VERSION])
    return hashlib.sha256(ident.encode()).hexdigest()


def cache_entry(source: str | Path, dtype: torch.dtype) -> Path:
    """The directory where ``source`` converted to ``dtype`` lives (or would)."""
    return cache_root() / cache_key(source, dtype)


def load_cached(source: str | Path, dtype: torch.dtype, device: torch.device | str = "cpu",
                ) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer | None] | None:
    """``(config, weights, tokenizer)`` from the cache, or None on a miss.

    An entry that cannot be read (say, from an older format) is removed, with a warning,
    and counts as a miss.
    """
    entry = cache_entry(source, dtype)
    if not (entry / _WEIGHTS).is_file():
        return None
    try:
        config = ModelConfig.from_dict(json.loads((entry / _CONFIG).read_text()))
        weights = load_file(str(entry / _WEIGHTS), device=str(device))
        tokenizer = Tokenizer.load(entry) if (entry / "tokenizer.json").is_file() else None
    except Exception as err:  # noqa: BLE001 -- any unreadable entry is rebuilt
        warnings.warn(f"removing unreadable weights cache entry {str(entry)!r}: {err}",
                      stacklevel=2)
        shutil.rmtree(entry, ignore_errors=True)
        return None
    return config, weights, tokenizer


def save_cached(source: str | Path, dtype: torch.dtype, config: ModelConfig,
                weights: dict[str, torch.Tensor], tokenizer: Tokenizer | None) -> Path:
    """Write an entry atomically (temp dir + rename) and return its directory.

    ``weights`` must already be in ``dtype``; they are copied to the CPU to be written.
    If another process finished the same entry first, its entry is kept.
    """
    entry = cache_entry(source, dtype)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    os.chmod(tmp, 0o755)             # mkdtemp makes it private; entries are plain cache data
    try:
        save_file({k: v.detach().to("cpu").contiguous() for k, v in weights.items()},
                  str(tmp / _WEIGHTS), metadata={"source": str(Path(source).resolve())})
        (tmp / _CONFIG).write_text(json.dumps(dataclasses.asdict(config), indent=1))
        if tokenizer is not None:
            tokenizer.save(tmp)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / _WEIGHTS).is_file():   # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry
