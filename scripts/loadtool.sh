#!/usr/bin/env bash
# Install an independent load tool (aiperf, or guidellm) into a venv of its own and print
# the path of the tool's command.
#
#   scripts/loadtool.sh [--tool aiperf|guidellm] [--version V] [--venv DIR]
#
#   --tool T      aiperf (default) or guidellm
#   --version V   the tool's release (default aiperf 0.13.0, guidellm 0.8.1)
#   --venv DIR    the venv (default $KVMAP_LOADTOOL_VENV or .venv-loadtool at the repo root)
#
# The tool is the second opinion benchmarks/loadtool_check.py sets beside `kvmap loadgen`
# against `kvmap serve`: another client, with its own clock and its own definitions of
# TTFT, inter-token latency and throughput. It brings its own pins (pydantic, zmq,
# transformers for its tokenizer, ...), hence a venv of its own, never the default
# set-up (scripts/setup.sh) and never a dependency of the kvmap package. Idempotent:
# when DIR already holds the tool at version V nothing is installed. The last line of
# stdout is the command's path; everything else goes to stderr.
set -euo pipefail

usage() { echo "usage: $0 [--tool aiperf|guidellm] [--version V] [--venv DIR]" >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
tool="aiperf"
version=""
venv="${KVMAP_LOADTOOL_VENV:-$root/.venv-loadtool}"
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) [ $# -ge 2 ] || usage; tool="$2"; shift 2 ;;
    --version) [ $# -ge 2 ] || usage; version="$2"; shift 2 ;;
    --venv) [ $# -ge 2 ] || usage; venv="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument '$1'" >&2; usage ;;
  esac
done
case "$tool" in
  aiperf) version="${version:-0.13.0}" ;;
  guidellm) version="${version:-0.8.1}" ;;
  *) echo "--tool must be aiperf or guidellm, got '$tool'" >&2; exit 2 ;;
esac
case "$version" in
  ''|*[!0-9.]*) echo "--version must look like 0.13.0, got '$version'" >&2; exit 2 ;;
esac

python="$venv/bin/python"
command="$venv/bin/$tool"
check="import importlib.metadata as m; print(m.version('$tool'))"
if [ -x "$command" ] && [ "$("$python" -c "$check" 2>/dev/null)" = "$version" ]; then
  echo "$command"; exit 0
fi
"${PYTHON:-python3}" -m venv "$venv" >&2
"$python" -m pip install --quiet --upgrade pip >&2
"$python" -m pip install "$tool==$version" >&2
[ "$("$python" -c "$check")" = "$version" ] && [ -x "$command" ] \
  || { echo "$tool $version did not install into $venv" >&2; exit 1; }
echo "$command"
