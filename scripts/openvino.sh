#!/usr/bin/env bash
# Install OpenVINO GenAI into a venv of its own and print that venv's python.
#
#   scripts/openvino.sh [--version V] [--venv DIR]
#
#   --version V   openvino-genai release (default 2026.4.1.0)
#   --venv DIR    the venv (default $KVMAP_OPENVINO_VENV or .venv-openvino at the repo root)
#
# Idempotent: when DIR/bin/python already imports openvino_genai at version V, it is
# printed and nothing is installed. The last line of stdout is the python's path;
# everything else goes to stderr. OpenVINO GenAI is a peer the benchmarks measure
# (scripts/openvino_server.py runs in this venv, examples/peers.yaml launches it), never
# a dependency of the kvmap package: nothing in src/ imports it or calls this script.
set -euo pipefail

usage() { echo "usage: $0 [--version V] [--venv DIR]" >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
version="2026.4.1.0"
venv="${KVMAP_OPENVINO_VENV:-$root/.venv-openvino}"
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || usage; version="$2"; shift 2 ;;
    --venv) [ $# -ge 2 ] || usage; venv="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument '$1'" >&2; usage ;;
  esac
done
case "$version" in
  ''|*[!0-9.]*) echo "--version must look like 2026.4.1.0, got '$version'" >&2; exit 2 ;;
esac

python="$venv/bin/python"
check="import importlib.metadata as m, openvino_genai; print(m.version('openvino-genai'))"
if [ -x "$python" ] && [ "$("$python" -c "$check" 2>/dev/null)" = "$version" ]; then
  echo "$python"; exit 0
fi
"${PYTHON:-python3}" -m venv "$venv" >&2
"$python" -m pip install --quiet --upgrade pip >&2
"$python" -m pip install "openvino-genai==$version" >&2
[ "$("$python" -c "$check")" = "$version" ] || { echo "openvino-genai $version did not import from $venv" >&2; exit 1; }
echo "$python"
