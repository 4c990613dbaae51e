"""The files a scenario reads, fingerprinted by content, so that a resumed run refuses to
reuse results after one of them changed.

A scenario names files by path: a model (GGUF or HF directory, ``smollm2`` is the
embedded GGUF), a corpus or trace of a workload, a task module (``my_tasks.py:fn``) or a
task's path parameter, a calibration file inside a KV spec (``static(path=FILE)``).
Each file's fingerprint is its size, its mtime and a BLAKE2b hash of its content -- of the
whole file up to ``FULL_HASH_BYTES``, of its first and last MiB beyond (the 98 MB GGUF
costs two 1 MiB reads, not 98 MB; a same-size edit in the middle of such a file is caught
by its mtime only).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

FULL_HASH_BYTES = 8 << 20
EDGE_BYTES = 1 << 20
_SPEC_PATH = re.compile(r"\b(?:path|file|calibration)=([^,()\s]+)")


def file_fingerprint(path: Path) -> str:
    st = path.stat()
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if st.st_size <= FULL_HASH_BYTES:
            h.update(f.read())
        else:
            h.update(f.read(EDGE_BYTES))
            f.seek(st.st_size - EDGE_BYTES)
            h.update(f.read(EDGE_BYTES))
    return f"{st.st_size}:{st.st_mtime_ns}:{h.hexdigest()}"


def _candidates(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [c for v in value.values() for c in _candidates(v)]
    if isinstance(value, (list, tuple)):
        return [c for v in value for c in _candidates(v)]
    if not isinstance(value, str):
        return []
    out = [value, value.rpartition(":")[0]] + _SPEC_PATH.findall(value)
    if value.lower() == "smollm2":
        try:
            from kvmap.model.loader import embedded_model_path
            out.append(str(embedded_model_path()))
        except Exception:  # noqa: BLE001 -- not installed: the scenario check says so
            pass
    return out


def input_files(scenario: Any) -> dict[str, str]:
    """``{path: fingerprint}`` of every existing file the scenario names (files of a
    model directory included)."""
    found: dict[str, str] = {}
    for name in _candidates(scenario.to_dict()):
        if not name or len(name) > 4096:
            continue
        path = Path(name).expanduser()
        try:
            files = ([p for p in sorted(path.iterdir()) if p.is_file()] if path.is_dir()
                     and path.is_absolute() else [path] if path.is_file() else [])
        except OSError:
            continue
        for f in files:
            found.setdefault(str(f.resolve()), file_fingerprint(f))
    return dict(sorted(found.items()))


def changed_files(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """Paths whose fingerprint differs (or that appeared or disappeared)."""
    return sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))
