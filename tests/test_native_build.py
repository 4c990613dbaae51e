"""A native library already built loads without ``load_inline``'s lock file: a ``kill -9``
of a process holding that lock (a bench cell) left every later load waiting forever."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmap.model import native_layer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(native_layer.ops() is None, reason="no native build here")
def test_a_stale_lock_does_not_stop_a_built_library_from_loading():
    built = native_layer.LIBRARY.built_path()
    assert built.is_file(), built
    lock = built.parent / "lock"          # load_inline's FileBaton, as a killed build leaves it
    lock.touch()
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        out = subprocess.run(
            [sys.executable, "-c", "from kvmap.model import native_layer; "
                                   "print(native_layer.ops() is not None)"],
            env=env, capture_output=True, text=True, timeout=60)
    finally:
        lock.unlink(missing_ok=True)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]
