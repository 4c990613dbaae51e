"""A C++ operator library built on first use, shared by the native kernels
(``kv.codecs.native``: the quantized write; ``model.native_decode``: decode attention;
``model.native_layer``: a Llama layer outside attention).

One concept: compile ``source`` with the system's C++ compiler
(``torch.utils.cpp_extension.load_inline``, cached under ``~/.cache/torch_extensions``
by ``name`` and a digest of source, flags and torch), register its ``TORCH_LIBRARY(namespace, ...)`` and hand back
``torch.ops.<namespace>``; when it cannot build (no compiler, no headers), say why once
in a warning and hand back None for good, so the caller runs its eager path.
``KVMAP_NATIVE=0`` turns every native library off (``ENABLED``).
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any

import torch

ENABLED = os.environ.get("KVMAP_NATIVE", "1") != "0"
ISA = torch.backends.cpu.get_cpu_capability()       # the instruction set torch dispatches to
_ISA_FLAGS = {
    "AVX512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma",
               "-mf16c"),
    "AVX2": ("-mavx2", "-mfma", "-mf16c"),
}
ISA_FLAGS = _ISA_FLAGS.get(ISA, ())   # compile for it (a library's name carries ISA)
# at::parallel_for is a header template over ``#pragma omp parallel``: compiled without
# OpenMP it runs the whole range on the calling thread, silently. With it the library
# links libgomp.so.1, which resolves to the one torch has loaded (same soname), so the
# operators share torch's pool and its thread count.
OPENMP = ("-fopenmp",) if torch.backends.openmp.is_available() else ()


class NativeLibrary:
    """``torch.ops.<namespace>`` compiled from ``source`` on first ``ops()``, or None."""

    def __init__(self, name: str, source: str, namespace: str, what: str,
                 flags: tuple[str, ...] = ()):
        self.name, self.source, self.namespace = name, source, namespace
        self.what, self.flags = what, flags
        self._ops: Any = None
        self.broken: str | None = None      # why building failed once; then eager for good

    def ops(self) -> Any:
        if self.broken is not None:
            return None
        if self._ops is None:
            try:
                self._load()
                self._ops = getattr(torch.ops, self.namespace)
            except Exception as e:  # noqa: BLE001 -- no compiler, no headers: run eager
                self.broken = f"{type(e).__name__}: {e}"
                warnings.warn(f"{self.what} is off ({self.broken[:200]}); running eager")
                return None
        return self._ops

    def _load(self) -> None:
        """The built library when it is there, else a build. The name carries a digest of
        the source, flags and torch version, so a library on disk is the one this code
        wants and loads without ``load_inline``: that takes a lock file on every call, and
        a process killed while holding it (``kill -9`` of a bench cell) left every later
        ``load_inline`` of that library waiting for it forever."""
        from torch.utils.cpp_extension import load_inline
        built = self.built_path()
        if built.is_file():
            torch.ops.load_library(str(built))
            return
        load_inline(built.stem, cpp_sources=[self.source], is_python_module=False,
                    extra_cflags=self._cflags(), extra_ldflags=list(OPENMP))

    def _cflags(self) -> list[str]:
        return ["-O3", "-ffp-contract=off", *OPENMP, *self.flags]

    def built_path(self) -> Path:
        """Where the library of this source, these flags and this torch is (or will be)."""
        from torch.utils.cpp_extension import _get_build_directory
        key = "\0".join([self.source, *self._cflags(), torch.__version__])
        name = f"{self.name}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        return Path(_get_build_directory(name, verbose=False)) / f"{name}.so"
