#!/usr/bin/env bash
# Install kvpress into a venv of its own and print that venv's python.
#
#   scripts/kvpress.sh [--version V] [--venv DIR] [--torch-wheel FILE]
#
#   --version V         kvpress release (default 0.5.5)
#   --venv DIR          the venv (default $KVMAP_KVPRESS_VENV or .venv-kvpress at the repo root)
#   --torch-wheel FILE  a CPU torch wheel to install first (default: a torch-*+cpu wheel
#                       in $PIP_FIND_LINKS / /opt/wheels when there is one); without it pip
#                       takes PyPI's default torch, which drags in the CUDA libraries
#
# kvpress 0.5.5 needs transformers < 5.3, older than kvmap's, hence its own venv; gguf
# and accelerate let transformers read the embedded SmolLM2 GGUF. Idempotent: when
# DIR/bin/python imports kvpress at version V nothing is installed. The last line of
# stdout is the python's path; everything else goes to stderr. kvpress is the accuracy
# anchor benchmarks/kvpress_check.py compares kvmap's policies with, never a dependency
# of the kvmap package.
set -euo pipefail

usage() { echo "usage: $0 [--version V] [--venv DIR] [--torch-wheel FILE]" >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
version="0.5.5"
venv="${KVMAP_KVPRESS_VENV:-$root/.venv-kvpress}"
wheel=""
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || usage; version="$2"; shift 2 ;;
    --venv) [ $# -ge 2 ] || usage; venv="$2"; shift 2 ;;
    --torch-wheel) [ $# -ge 2 ] || usage; wheel="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument '$1'" >&2; usage ;;
  esac
done
case "$version" in
  ''|*[!0-9.]*) echo "--version must look like 0.5.5, got '$version'" >&2; exit 2 ;;
esac

python="$venv/bin/python"
check="import importlib.metadata as m, kvpress; print(m.version('kvpress'))"
if [ -x "$python" ] && [ "$("$python" -c "$check" 2>/dev/null)" = "$version" ]; then
  echo "$python"; exit 0
fi
if [ -z "$wheel" ]; then
  wheel="$(ls "${PIP_FIND_LINKS:-/opt/wheels}"/torch-*+cpu-*.whl 2>/dev/null | tail -1 || true)"
fi
"${PYTHON:-python3}" -m venv "$venv" >&2
"$python" -m pip install --quiet --upgrade pip >&2
"$python" -m pip install ${wheel:+"$wheel"} "kvpress==$version" "transformers<5.3" gguf accelerate >&2
[ "$("$python" -c "$check")" = "$version" ] || { echo "kvpress $version did not import from $venv" >&2; exit 1; }
echo "$python"
